package node

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// TestQuickRestartDuringTailRepair: an initiator's node stops with a txn
// that reached one survivor and not the other, and is back (a new
// process, a new feed) while the survivors are still repairing its old
// feed's tail. The repair must still end with both survivors holding the
// txn and neither failing: the peer answers for the old process's feed
// though the new one is open, and the new feed is taken in only after
// the old tail is settled, so the initiator's re-added sequence is never
// removed under it. Before, the repair failed ("the feed from initiator
// 3 is still open here") or the new feed's heartbeats were refused
// ("unknown initiator"), and the survivors' replicas failed together.
func TestQuickRestartDuringTailRepair(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(t, 3, 0, cfg)
	slowRepair := func(cfg *Config) {
		cfg.NodeTTL = 2 * time.Second
		cfg.testRepairDelay = 1500 * time.Millisecond
	}
	c.startCfg(1, slowRepair)
	c.startCfg(2, slowRepair)
	var mu sync.Mutex
	var torn txnid.ID
	armed := false
	skip := func(node string, id txnid.ID) bool {
		mu.Lock()
		defer mu.Unlock()
		if armed && node == NodeName(2) {
			if torn == 0 {
				torn = id
			}
			return true
		}
		return false
	}
	a3 := c.startCfg(3, func(cfg *Config) { cfg.NodeTTL = 2 * time.Second; cfg.testSkip = skip })
	cl3 := dialClient(t, a3.TCP)
	waitWritable(t, cl3, 1)
	for i := range 100 {
		upsert(t, cl3, 1, i)
	}
	mu.Lock()
	armed = true
	mu.Unlock()
	upsert(t, cl3, 1, 1_000_000)
	mu.Lock()
	id := torn
	mu.Unlock()
	if id == 0 {
		t.Fatal("the hook never tore a txn")
	}
	// Back at once: the survivors' repair of the old feed is held for
	// 1.5 s, so the new process's feeds open while it is under way.
	c.stop(3)
	c.startCfg(3, func(cfg *Config) { cfg.NodeTTL = 2 * time.Second })
	cl1 := dialClient(t, c.nodes[1].addrs.TCP)
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	for i := 100; i < 200; i++ {
		upsert(t, cl1, 1, i)
	}
	// A survivor that failed would rejoin and be live again later: watch
	// past the repair's retries (3 node TTLs) that neither ever rejoined.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		for _, id := range []int{1, 2} {
			st := nodeStatus(t, c.nodes[id].addrs)
			if r := st.Replicas[0]; r.State != StateLive || r.Rejoin != nil {
				t.Fatalf("survivor n%d's replica: state %s, rejoin %+v", id, r.State, r.Rejoin)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	r, err := cl1.call(0, partition.ProcDigest, true)
	if err != nil || len(r.Each) != 3 {
		t.Fatalf("digest: %v, %d replicas", err, len(r.Each))
	}
	checkDigests(t, cl1, 1, 3)
}

// TestFirstStartAfterWrites: a node of the placement that has never run
// would come up with its replicas live and empty. So no call is taken
// before every node of the placement has started once; before, a write
// taken by n1 and n2 was missing on n3's replica, live from its first
// start, and the digests differed.
func TestFirstStartAfterWrites(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(t, 3, 2, cfg)
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	key := wire.Bytes([]byte("early"))
	_, err := cl.call(0, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes([]byte("v")))
	if err == nil {
		t.Log("a write was taken before n3 ever started")
	} else if !strings.Contains(err.Error(), "not bootstrapped") {
		t.Fatalf("early write: %v", err)
	}
	c.start(3)
	waitWritable(t, cl, 1)
	for i := range 50 {
		upsert(t, cl, 1, i)
	}
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	checkDigests(t, cl, 1, 3)
}
