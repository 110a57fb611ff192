package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/nodestate"
	"github.com/rejoin-db/rejoin/wire"
)

// loadRows writes rows rows of valueBytes-byte values to partition 0, 400
// to a txn.
func loadRows(t *testing.T, cl *rawClient, rows, valueBytes int) {
	t.Helper()
	vals := make([]wire.Value, 0, 2+2*400)
	for b := 0; b < rows; b += 400 {
		n := min(400, rows-b)
		vals = append(vals[:0], wire.String("kv"), wire.Int64(int64(n)))
		for i := range n {
			vals = append(vals, wire.Bytes(fmt.Appendf(nil, "key-%08d", b+i)), wire.Bytes(make([]byte, valueBytes)))
		}
		if _, err := cl.call(0, partition.ProcUpsertMany, false, vals...); err != nil {
			t.Fatal(err)
		}
	}
}

// taskRecord reads the rejoin task of partition 0 onto n2.
func taskRecord(t *testing.T, c *cluster) claim.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, err := claim.GetTask(ctx, c.admin, claim.Task{Partition: 0, Dest: NodeName(2)})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestSlowRejoinFinishesInOneAttempt: a rate-limited rejoin that takes
// several times the health task's stale limit keeps its task, because its
// source refreshes the task record as blocks are acknowledged (DESIGN.md
// step 1). It ends live in its first attempt. Without the refresh the
// health task resets the task every stale limit and each new attempt
// starts from zero, forever.
func TestSlowRejoinFinishesInOneAttempt(t *testing.T) {
	const staleAfter = 2 * time.Second
	c := newClusterStarting(t, 2, 0, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	slow := func(cfg *Config) {
		cfg.Codec = wire.CodecNone // the limit counts the rows' own bytes
		cfg.RateBytesPerSec = 500 << 10
		// The record is touched on progress at most once a claim window,
		// so the window stays under the stale limit; at 750 ms, a check
		// the lease guard waited on for longer under -race on a loaded
		// machine ended the attempt (claim not certainly held) now and
		// then, and the task took two.
		cfg.ClaimTTL, cfg.ClaimWindow = 4*time.Second, time.Second
		cfg.knobs.staleAfter = staleAfter
	}
	c.startCfg(1, slow)
	c.startCfg(2, slow)
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	// About 4 MB: eight seconds at the rate limit, four stale limits.
	loadRows(t, cl, 4000, 1000)
	c.stop(2)
	started := time.Now()
	a2 := c.startCfg(2, slow)
	waitUntil(t, 45*time.Second, "n2's replica live", func() bool {
		return nodeStatus(t, a2).Replicas[0].State == recovery.ReplicaLive
	})
	took := time.Since(started)
	if took < 3*staleAfter {
		t.Fatalf("the rejoin took %s, under three stale limits (%s): the test lost its point", took, staleAfter)
	}
	var rec claim.Record
	waitUntil(t, 10*time.Second, "the task done", func() bool {
		rec = taskRecord(t, c)
		return rec.Status == claim.StatusDone
	})
	t.Logf("rejoin took %s (stale limit %s); task %s after %d attempts", took, staleAfter, rec.Status, rec.Attempts)
	if rec.Attempts != 1 {
		t.Fatalf("task done after %d attempts, want 1: a rejoin that made progress was reset", rec.Attempts)
	}
	for i := range 50 {
		upsert(t, cl, 1, i)
	}
	checkDigests(t, cl, 1, 2)
}

// TestFailedHandoffRejoinsAgain: the source's first Handoff is lost on its
// way and its second arrives with a wrong digest. Neither attempt may end
// done: with no HandoffAck the first source aborts after its stall window,
// the destination refuses the second and aborts it. Each time the task
// goes back to pending, and the third attempt brings the replica live
// with the same digest as the source's.
func TestFailedHandoffRejoinsAgain(t *testing.T) {
	c := newClusterStarting(t, 2, 0, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	var mu sync.Mutex
	var epochs []uint64
	var lost, corrupted int
	hook := func(epoch uint64, h *wire.Handoff) *wire.Handoff {
		mu.Lock()
		defer mu.Unlock()
		i := slices.Index(epochs, epoch)
		if i < 0 {
			epochs = append(epochs, epoch)
			i = len(epochs) - 1
		}
		switch i {
		case 0:
			lost++
			return nil
		case 1:
			corrupted++
			h.Digest ^= 1
		}
		return h
	}
	c.startCfg(1, func(cfg *Config) {
		cfg.knobs.handoff = hook
		cfg.knobs.sourceStallTicks = 150 // 1.5 s without the ack
	})
	c.start(2)
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	loadRows(t, cl, 2000, 50)
	c.stop(2)
	a2 := c.start(2)
	i := 0
	// Why each failed attempt was requeued, as its record says until the
	// next attempt starts (at least half a second later).
	notes := map[string]bool{}
	waitUntil(t, 60*time.Second, "n2's replica live", func() bool {
		upsert(t, cl, 1, i) // writes go on throughout
		i++
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rec, err := claim.GetTask(rctx, c.admin, claim.Task{Partition: 0, Dest: NodeName(2)})
		cancel()
		if err == nil && rec.Status == claim.StatusPending && rec.Note != "" {
			notes[rec.Note] = true
		}
		return nodeStatus(t, a2).Replicas[0].State == recovery.ReplicaLive
	})
	var sawLost, sawMismatch bool
	for note := range notes {
		sawLost = sawLost || strings.Contains(note, "(timeout, local)") && strings.Contains(note, "handing-off")
		// The destination's abort reached the source: it did not have
		// to wait out its stall window.
		sawMismatch = sawMismatch || strings.Contains(note, "(digest-mismatch, peer)")
	}
	if !sawLost || !sawMismatch {
		t.Errorf("requeue notes %q: want a source timed out handing off and one told of the digest mismatch", slices.Sorted(maps.Keys(notes)))
	}
	var rec claim.Record
	waitUntil(t, 10*time.Second, "the task done", func() bool {
		rec = taskRecord(t, c)
		return rec.Status == claim.StatusDone
	})
	mu.Lock()
	n, l, k := len(epochs), lost, corrupted
	mu.Unlock()
	t.Logf("handoffs of %d attempts (lost %d, corrupted %d); task done after %d attempts at epoch %d", n, l, k, rec.Attempts, rec.Epoch)
	if n < 3 || l == 0 || k == 0 || rec.Attempts < 3 {
		t.Fatalf("%d attempts handed off (%d lost, %d corrupted), task done after %d starts; want the third to finish", n, l, k, rec.Attempts)
	}
	for j := range 50 {
		upsert(t, cl, 1, i+j)
	}
	// n1 waits for n2's replica once its own view, read every 100 ms,
	// has it live: the task done does not say that view was read.
	waitUntil(t, 10*time.Second, "n1's digest call waits for every replica", func() bool {
		r, err := cl.call(0, partition.ProcDigest, true)
		return err == nil && len(r.Each) == 2
	})
	checkDigests(t, cl, 1, 2)
}

// TestNewerAttemptSupersedesSource: the health task reset a task (its
// claim key deleted) and a newer attempt claimed it before the running
// source noticed. The replica's one source slot goes to the newer epoch:
// the old attempt aborts as superseded. An older epoch, or another task's
// attempt, is refused while one runs.
func TestNewerAttemptSupersedesSource(t *testing.T) {
	cli, ctx := testEtcd(t, 30*time.Second)
	schema, err := layout.KV().Schema()
	if err != nil {
		t.Fatal(err)
	}
	store, _, err := nodestate.Open(filepath.Join(t.TempDir(), "n1"), "n1", time.Now(), testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	n := &Node{cfg: Config{ClaimWindow: 5 * time.Second}, id: "n1", log: testLog(t), ctx: ctx, cli: cli, store: store,
		procs: partition.NewBuiltinRegistry(), schemas: []partition.Schema{schema}}
	n.metrics = newMetrics(n)
	r, err := newReplica(n, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	r.addInitiator(1, 1, &beatSlot{})
	task := claim.Task{Partition: 0, Dest: "n2"}
	attempt := func(task claim.Task) *srcAttempt {
		t.Helper()
		c, err := claim.Acquire(ctx, cli, task, claim.NewExecutorID(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Release(context.Background()) })
		return &srcAttempt{task: task, claim: c, epoch: c.Epoch(), started: time.Now(), link: newLink(wire.CodecNone), end: make(chan struct{})}
	}
	old := attempt(task)
	if err := r.startSource(old); err != nil {
		t.Fatal(err)
	}
	// The reset: the claim key goes; the old executor learns of it only
	// at its next check, up to a window later.
	if _, err := cli.Delete(ctx, task.ClaimKey()); err != nil {
		t.Fatal(err)
	}
	newer := attempt(task)
	if err := r.startSource(newer); err != nil {
		t.Fatalf("epoch %d refused while epoch %d runs: %v", newer.epoch, old.epoch, err)
	}
	var ae *recovery.AbortError
	if r.src != newer || !ended(old.end) || !errors.As(old.err, &ae) || ae.Reason != wire.AbortStaleEpoch {
		t.Fatalf("after the newer attempt: source of epoch %d, old attempt ended %v with %v", r.src.epoch, ended(old.end), old.err)
	}
	stale := &srcAttempt{task: task, claim: old.claim, epoch: old.epoch, link: newLink(wire.CodecNone), end: make(chan struct{})}
	if err := r.startSource(stale); err == nil || r.src != newer {
		t.Fatalf("the superseded epoch %d started again: %v", old.epoch, err)
	}
	other := attempt(claim.Task{Partition: 0, Dest: "n3"})
	if err := r.startSource(other); err == nil || r.src != newer {
		t.Fatalf("another task's attempt (epoch %d) took the running one's place: %v", other.epoch, err)
	}
	r.stop()
	if r.src != nil || !ended(newer.end) {
		t.Fatal("the newer attempt outlived the replica's stop")
	}
}

// TestLostHandoffAckStaysDone: the destination goes live and its
// HandoffAck is lost. The source cannot tell a lost ack from a lost
// handoff: it times out and requeues. The destination's own completion
// (it is live at E with the source's digest) stands: the task is done
// once, the requeue changes nothing, no new attempt starts, and the
// replica stays live.
func TestLostHandoffAckStaysDone(t *testing.T) {
	c := newClusterStarting(t, 2, 0, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	c.startCfg(1, func(cfg *Config) { cfg.knobs.sourceStallTicks = 150 })
	c.startCfg(2, func(cfg *Config) { cfg.knobs.loseHandoffAck = true })
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	loadRows(t, cl, 2000, 50)
	c.stop(2)
	a2 := c.startCfg(2, func(cfg *Config) { cfg.knobs.loseHandoffAck = true })
	waitUntil(t, 30*time.Second, "n2's replica live", func() bool {
		return nodeStatus(t, a2).Replicas[0].State == recovery.ReplicaLive
	})
	// The source gives up waiting for the ack after its stall window.
	var src RejoinStatus
	waitUntil(t, 20*time.Second, "the source's attempt to end", func() bool {
		srcs := nodeStatus(t, c.nodes[1].addrs).Replicas[0].Sources
		if len(srcs) == 0 || srcs[0].Ended.IsZero() {
			return false
		}
		src = srcs[0]
		return true
	})
	if src.Phase != "aborted" || !strings.Contains(src.Err, "handing-off") {
		t.Fatalf("source ended %s (%s); want aborted waiting for the ack", src.Phase, src.Err)
	}
	// Its requeue has been tried (it follows the end at once); a new
	// attempt would come half a second after it.
	time.Sleep(2 * time.Second)
	rec := taskRecord(t, c)
	if rec.Status != claim.StatusDone || rec.Attempts != 1 {
		t.Fatalf("task %s after %d attempts (note %q); want done after 1", rec.Status, rec.Attempts, rec.Note)
	}
	if st := nodeStatus(t, a2).Replicas[0]; st.State != recovery.ReplicaLive || st.Rejoin == nil || st.Rejoin.Epoch != src.Epoch {
		t.Fatalf("n2's replica %s after the source's abort", st.State)
	}
	for i := range 50 {
		upsert(t, cl, 1, i)
	}
	checkDigests(t, cl, 1, 2)
}

// TestLiveDestinationCompletesAfterOutage: the destination goes live, its
// HandoffAck is lost, and its first tries at completing the task fail (as
// when etcd is out through the handoff). The source times out waiting for
// the ack and requeues the task. The destination tries again until its
// completion lands: the task ends done. With one try only it stayed
// pending for ever, every new attempt refused by the live replica (found
// by the simulator: recovery/sim, scenario coordinator-outage).
func TestLiveDestinationCompletesAfterOutage(t *testing.T) {
	c := newClusterStarting(t, 2, 0, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	c.startCfg(1, func(cfg *Config) { cfg.knobs.sourceStallTicks = 150 })
	c.startCfg(2, nil)
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	loadRows(t, cl, 2000, 50)
	c.stop(2)
	a2 := c.startCfg(2, func(cfg *Config) { cfg.knobs.loseHandoffAck, cfg.knobs.completeFails = true, 6 })
	waitUntil(t, 30*time.Second, "n2's replica live", func() bool {
		return nodeStatus(t, a2).Replicas[0].State == recovery.ReplicaLive
	})
	waitUntil(t, 30*time.Second, "the task done", func() bool {
		return taskRecord(t, c).Status == claim.StatusDone
	})
	if st := nodeStatus(t, a2).Replicas[0]; st.State != recovery.ReplicaLive {
		t.Fatalf("n2's replica %s after the task was done", st.State)
	}
	for i := range 50 {
		upsert(t, cl, 1, i)
	}
	checkDigests(t, cl, 1, 2)
}

// TestBrokenRejoinHoldsNoLonger: the destination's buffer passes its mark
// and the source holds its partition for it (wire.Hold, writes wait);
// then every connection into the destination resets, and each new one
// for longer than the source's resume grace. The partition's live
// replica is the source's: writes through it go on within brokenHoldMax
// and a check or two, once the source gives the attempt up, not after
// resumeGrace (rejoin chaos --net-faults on --seed 20261208: 3.95 s
// without a successful op on a partition whose live replicas were up,
// held by a source for a destination killed in the handoff's pause).
// Reachable again, the destination rejoins, with equal digests.
func TestBrokenRejoinHoldsNoLonger(t *testing.T) {
	// Three nodes: n3, which holds no replica, hears n1 throughout, so
	// n2's report of n1, whose feed into n2 is cut, fences no one. Of
	// two, n2's word alone would fence n1, which holds the partition's
	// live replica, and no write would pass until the cut ended.
	c := newClusterWith(t, 3, 0, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}}, func(c *cluster) { c.proxied = true })
	slow := func(cfg *Config) {
		cfg.Codec = wire.CodecNone // the limit counts the rows' own bytes
		cfg.RateBytesPerSec = 300 << 10
	}
	c.startCfg(1, slow)
	c.startCfg(2, slow)
	c.startCfg(3, slow)
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, 1)
	loadRows(t, cl, 10000, 1000) // 10 MB: half a minute at the limit
	c.stop(2)
	a2 := c.startCfg(2, func(cfg *Config) {
		slow(cfg)
		cfg.RejoinBufferBytesMax = 1 << 20 // the hold at half of it
	})
	// One writer, its completions timed, over 200 keys (the partition
	// stays at the size loaded), at most 500 a second: the destination's
	// buffer passes its mark mid-stream. A write held past the call's
	// bound is answered as of unknown outcome; the writer goes on.
	var mu sync.Mutex
	var done []time.Time
	stop := make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				wrote <- nil
				return
			default:
			}
			key := wire.Bytes(fmt.Appendf(nil, "w-%03d", i%200))
			if _, err := cl.call(0, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes(make([]byte, 1000))); err != nil {
				if !strings.Contains(err.Error(), "outcome is unknown") {
					wrote <- err
					return
				}
				continue // held past the call's bound (Config.CallWait)
			}
			mu.Lock()
			done = append(done, time.Now())
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	waitUntil(t, 30*time.Second, "n1 to hold its partition for n2", func() bool {
		for _, r := range nodeStatus(t, c.nodes[1].addrs).Replicas {
			for _, s := range r.Sources {
				if s.PeerHoldMs > 0 && !strings.Contains(s.Phase, "handing") && s.Phase != "done" && s.Phase != "aborted" {
					return true
				}
			}
		}
		return false
	})
	cut := time.Now()
	c.proxies[2].Reset(2 * resumeGrace)
	waitUntil(t, 2*resumeGrace, "a write after the cut", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) > 0 && done[len(done)-1].After(cut)
	})
	mu.Lock()
	var first time.Time
	for _, d := range done {
		if d.After(cut) {
			first = d
			break
		}
	}
	mu.Unlock()
	gap := first.Sub(cut)
	t.Logf("first write through n1 %s after the cut (brokenHoldMax %s, resumeGrace %s)", gap.Round(time.Millisecond), brokenHoldMax, resumeGrace)
	if gap >= resumeGrace-time.Second {
		t.Errorf("the first write came %s after the cut: the source held its partition for a destination it could not reach", gap.Round(time.Millisecond))
	}
	// No more writes: the next attempt is held by nothing.
	close(stop)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 90*time.Second, "n2's replica live", func() bool {
		return nodeStatus(t, a2).Replicas[0].State == recovery.ReplicaLive
	})
	waitUntil(t, 10*time.Second, "n1's digest call waits for every replica", func() bool {
		r, err := cl.call(0, partition.ProcDigest, true)
		return err == nil && len(r.Each) == 2
	})
	checkDigests(t, cl, 1, 2)
}
