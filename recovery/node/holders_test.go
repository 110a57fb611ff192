package node

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// TestSilentNodeStallsOnlyItsPartitions: three nodes, two replicas of each
// partition. n2 goes silent (not a byte to or from its peers or etcd) for
// three node TTLs. The partitions it holds no replica of never wait for
// it: only their holders sequence their txns, and a replica tracks only
// the initiators that joined its partition (docs/DESIGN.md "Sequencers
// per partition"). Before, every replica tracked every node's initiator,
// and writes to those partitions stopped until n2 was fenced, as long as
// writes to n2's own (about 2 s). A call through a node that holds no
// replica of its partition is forwarded to one that does.
func TestSilentNodeStallsOnlyItsPartitions(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 6
	// The goal is 0.5 s (issue 23); the bound leaves a loaded machine
	// room and still fails a stall until the fence.
	const gapMax = time.Second
	c, etcdPx := newClusterN2ViaProxyWith(t, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs, err := supervise.Replicas(ctx, c.admin)
	if err != nil {
		t.Fatal(err)
	}
	onN2 := map[uint32]bool{}
	for _, r := range rs {
		if r.Node == "n2" {
			onN2[r.Partition] = true
		}
	}
	var away []uint32
	for p := range uint32(parts) {
		if !onN2[p] {
			away = append(away, p)
		}
	}
	if len(away) == 0 || len(onN2) == 0 {
		t.Fatalf("placement gives n2 partitions %v of %d: the test needs some on it and some not", onN2, parts)
	}
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	// A partition n1 holds no replica of is written through n1 all the
	// same: forwarded to a holder.
	for p := range uint32(parts) {
		if _, err := cl.call(p, partition.ProcDigest, false); err != nil {
			t.Fatalf("partition %d through n1: %v", p, err)
		}
	}

	ws, stopWriters := startFeedWritersOnly(t, c, parts, []int{1, 3}, 2*time.Millisecond, func(p uint32) bool { return !onN2[p] })
	defer stopWriters()
	waitUntil(t, 15*time.Second, "writes through n1 and n3", func() bool { return ws[0].count() >= 50 && ws[1].count() >= 50 })

	thaw := freezeAll(append(c.pathsOf(2), etcdPx))
	defer thaw()
	frozen := time.Now()
	time.Sleep(3 * ttl)
	thaw()
	thawed := time.Now()
	for _, w := range ws {
		w.mu.Lock()
		gap := longestGap(w.ackedAt, frozen, thawed)
		w.mu.Unlock()
		t.Logf("writes through n%d to partitions %v, which n2 holds no replica of, in the %v of its silence: longest gap %v",
			w.node, away, thawed.Sub(frozen).Round(time.Millisecond), gap.Round(time.Millisecond))
		if gap > gapMax {
			t.Errorf("writes through n%d to partitions without a replica on n2 stopped for %v while n2 was silent, want at most %v", w.node, gap.Round(time.Millisecond), gapMax)
		}
	}
	waitUntil(t, 30*time.Second, "every replica live again", func() bool { return allLive(t, c) })
	stopWriters()
	checkAcked(t, cl, parts, ws)
	checkDigests(t, cl, parts, 2)
}

// TestRestartedCutOffNodeStallsOnlyItsPartitions: n2 stops, and its next
// process starts cut off from its peers (it reaches etcd and registers):
// alive in every view, it opens no feed anywhere until its peers fence
// it. Writes through n1 and n3 to the partitions n2 holds no replica of
// must not wait for it (chaos seeds 444388825 and 5511: 0.7 to 1.8 s
// without a successful op in such partitions, until the new process was
// fenced).
func TestRestartedCutOffNodeStallsOnlyItsPartitions(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 6
	const gapMax = time.Second // as TestSilentNodeStallsOnlyItsPartitions
	c, _ := newClusterN2ViaProxyWith(t, layout.Config{Partitions: parts, Replicas: 2, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs, err := supervise.Replicas(ctx, c.admin)
	if err != nil {
		t.Fatal(err)
	}
	onN2 := map[uint32]bool{}
	for _, r := range rs {
		if r.Node == "n2" {
			onN2[r.Partition] = true
		}
	}
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	ws, stopWriters := startFeedWritersOnly(t, c, parts, []int{1, 3}, 2*time.Millisecond, func(p uint32) bool { return !onN2[p] })
	defer stopWriters()
	waitUntil(t, 15*time.Second, "writes through n1 and n3", func() bool { return ws[0].count() >= 50 && ws[1].count() >= 50 })

	c.stop(2)
	waitRegistered(t, c, "n2", false, 10*time.Second, "n2 gone")
	thaw := freezeAll(c.pathsOf(2))
	defer thaw()
	from := time.Now()
	c.start(2)
	time.Sleep(3 * ttl)
	to := time.Now()
	for _, w := range ws {
		w.mu.Lock()
		gap := longestGap(w.ackedAt, from, to)
		w.mu.Unlock()
		t.Logf("writes through n%d to the partitions n2 holds no replica of, in the %v after n2's new process started cut off: longest gap %v",
			w.node, to.Sub(from).Round(time.Millisecond), gap.Round(time.Millisecond))
		if gap > gapMax {
			t.Errorf("writes through n%d to partitions without a replica on n2 stopped for %v while n2's new process was cut off, want at most %v", w.node, gap.Round(time.Millisecond), gapMax)
		}
	}
	thaw()
	waitUntil(t, 30*time.Second, "every replica live again", func() bool { return allLive(t, c) })
	stopWriters()
	checkAcked(t, cl, parts, ws)
	checkDigests(t, cl, parts, 2)
}

// TestFencedNodeBackBesideCutOffNewProcess: the case of chaos seeds
// 444388825 and 5511 whole. n2 goes silent (peers and etcd) until its
// peers fence it; meanwhile n1 stops, and its next process starts cut
// off from its peers. n2 comes back, its replicas fail and rejoin. The
// partitions n1 holds no replica of must go on being written through
// n3 and n4 without waiting for n1's new process to be fenced.
func TestFencedNodeBackBesideCutOffNewProcess(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 4
	const gapMax = time.Second
	var logs logCatch
	c, etcdPx := newClusterNViaProxy(t, 4, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		c.onLog = func(id int, r slog.Record) {
			if r.Message == "process fenced by its peers' reports: taken for dead here" {
				logs.add("taken", id, r)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs, err := supervise.Replicas(ctx, c.admin)
	if err != nil {
		t.Fatal(err)
	}
	onN1 := map[uint32]bool{}
	for _, r := range rs {
		if r.Node == "n1" {
			onN1[r.Partition] = true
		}
	}
	cl := dialClient(t, c.direct(3))
	waitWritable(t, cl, parts)
	ws, stopWriters := startFeedWritersOnly(t, c, parts, []int{3, 4}, 2*time.Millisecond, func(p uint32) bool { return !onN1[p] })
	defer stopWriters()
	waitUntil(t, 15*time.Second, "writes through n3 and n4", func() bool { return ws[0].count() >= 50 && ws[1].count() >= 50 })

	thawN2 := freezeAll(append(c.pathsOf(2), etcdPx))
	defer thawN2()
	// Fenced by its peers, or its lease ended first: either way gone.
	waitRegistered(t, c, "n2", false, 15*time.Second, "n2 taken for dead")
	c.stop(1)
	waitRegistered(t, c, "n1", false, 10*time.Second, "n1 gone")
	thawN1 := freezeAll(c.pathsOf(1))
	defer thawN1()
	c.start(1)
	thawN2()
	from := time.Now()
	waitUntil(t, 15*time.Second, "n1's new process taken for dead", func() bool {
		for _, s := range logs.seen("taken") {
			if strings.Contains(s, `node="n1"`) {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second)
	to := time.Now()
	for _, w := range ws {
		w.mu.Lock()
		gap := longestGap(w.ackedAt, from, to)
		w.mu.Unlock()
		t.Logf("writes through n%d to the partitions n1 holds no replica of, in the %v after n2 came back: longest gap %v",
			w.node, to.Sub(from).Round(time.Millisecond), gap.Round(time.Millisecond))
		if gap > gapMax {
			t.Errorf("writes through n%d to partitions without a replica on n1 stopped for %v after n2 came back beside n1's cut-off process, want at most %v", w.node, gap.Round(time.Millisecond), gapMax)
		}
	}
	thawN1()
	waitUntil(t, 30*time.Second, "every replica live again", func() bool { return allLive(t, c) })
	stopWriters()
	checkAcked(t, cl, parts, ws)
	checkDigests(t, cl, parts, 3)
}

// TestResetNodeStallsOnlyItsPartitions: every connection between n1 and
// its peers is reset, and every new one too, for three TTLs (a partition
// that answers with resets, not silence). n1 holds no replica of some
// partitions: writes to them through the other four nodes, holders and
// nodes that forward, must not wait for it. (Chaos seed 5511 saw 0.8 s
// without a successful op in such partitions over a reset of a node's
// peer links among other faults; this case alone stays near 14 ms.)
func TestResetNodeStallsOnlyItsPartitions(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 5
	const gapMax = time.Second
	c, _ := newClusterNViaProxy(t, 5, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs, err := supervise.Replicas(ctx, c.admin)
	if err != nil {
		t.Fatal(err)
	}
	onN1 := map[uint32]bool{}
	for _, r := range rs {
		if r.Node == "n1" {
			onN1[r.Partition] = true
		}
	}
	cl := dialClient(t, c.direct(3))
	waitWritable(t, cl, parts)
	ws, stopWriters := startFeedWritersOnly(t, c, parts, []int{2, 3, 4, 5}, 2*time.Millisecond, func(p uint32) bool { return !onN1[p] })
	defer stopWriters()
	waitUntil(t, 15*time.Second, "writes through n2 to n5", func() bool {
		for _, w := range ws {
			if w.count() < 50 {
				return false
			}
		}
		return true
	})

	from := time.Now()
	for _, px := range c.pathsOf(1) {
		px.Reset(3 * ttl)
	}
	time.Sleep(3 * ttl)
	to := time.Now()
	for _, w := range ws {
		w.mu.Lock()
		gap := longestGap(w.ackedAt, from, to)
		w.mu.Unlock()
		t.Logf("writes through n%d to the partitions n1 holds no replica of, in the %v of its links' resets: longest gap %v",
			w.node, to.Sub(from).Round(time.Millisecond), gap.Round(time.Millisecond))
		if gap > gapMax {
			t.Errorf("writes through n%d to partitions without a replica on n1 stopped for %v while n1's links were reset, want at most %v", w.node, gap.Round(time.Millisecond), gapMax)
		}
	}
	waitUntil(t, 30*time.Second, "every replica live again", func() bool { return allLive(t, c) })
	stopWriters()
	checkAcked(t, cl, parts, ws)
	checkDigests(t, cl, parts, 3)
}
