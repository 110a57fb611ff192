package node

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/stream/faultnet"
)

// TestTailRepairHoldsForLivePeers: a replica that repairs a dead
// initiator's tail holds, for as long as the fault lasts, while a live
// peer cannot give its part of the tail; it never fails for it, so a
// network fault alone does not take the last live replicas of a
// partition. Three nodes, each holding a replica of every partition, TTL
// 2 s; the cut outlasts the repair's old bound (3 TTLs) by far.
//
//   - peer still fed: n2 is cut from etcd and from n3, not from n1. Its
//     lease ends; n3 repairs its tail and asks n1, which n2 still feeds.
//     n1 used to refuse while its feed was open, and n3 failed every
//     replica after the bound (rejoin chaos --net-faults on, seed
//     20261128: "the feed from initiator 1 ... is still open here"). Now
//     n1 takes n2 for dead at the ask, closes its feed and answers.
//   - peer unreachable: n1 and n3 are cut from each other, then n2 stops.
//     Each repairs n2's tail from the other, alive and unreachable. Both
//     used to fail every replica after the bound, and with n2 gone no
//     partition kept a live replica (seed 690063411: "tail not repaired:
//     [peer: dial ... connection refused]"). Now both hold until the cut
//     heals.
//
// Either way, after the heal every replica ends live with one digest and
// every acknowledged write, and no replica of n1 or n3 failed. The fence
// for a cut between two nodes is off: it would fence n3 within seconds
// of the cut, and the repair's hold is what holds where no fence comes
// (TestCutLinkFencesOne has the fence).
func TestTailRepairHoldsForLivePeers(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 4
	const cutFor = 8 * ttl
	for _, tc := range []struct {
		name string
		// cut returns the proxies to freeze; before, the moment the cut
		// is in, to stop a node (n2) if the case needs it.
		cut    func(c *cluster, etcdPx *faultnet.Proxy) []*faultnet.Proxy
		stopN2 bool
	}{
		{"peer still fed", func(c *cluster, etcdPx *faultnet.Proxy) []*faultnet.Proxy {
			return []*faultnet.Proxy{etcdPx, c.proxies[2], c.pairs[[2]int{2, 3}], c.pairs[[2]int{3, 2}]}
		}, false},
		{"peer unreachable", func(c *cluster, _ *faultnet.Proxy) []*faultnet.Proxy {
			return []*faultnet.Proxy{c.pairs[[2]int{1, 3}], c.pairs[[2]int{3, 1}]}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logCatch
			c, etcdPx := newClusterN2ViaProxyWith(t, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
				c.proxied, c.pairProxied, c.noCutFence = true, true, true
				c.onLog = func(id int, r slog.Record) {
					if r.Message == "replica failed, needs a rejoin" && id != 2 {
						logs.add("failures", id, r)
					}
				}
			})
			failed := func() []string { return logs.seen("failures") }
			cl := dialClient(t, c.direct(1))
			waitWritable(t, cl, parts)
			ws, stopWriters := startFeedWriters(t, c, parts, []int{1, 3}, 2*time.Millisecond)
			defer stopWriters()
			waitWriting(t, ws, "writes through n1 and n3")

			thaw := freezeAll(tc.cut(c, etcdPx))
			defer thaw()
			cutAt := time.Now()
			if tc.stopN2 {
				c.stop(2)
			}
			gone := false
			for time.Since(cutAt) < cutFor {
				if fs := failed(); len(fs) > 0 {
					t.Fatalf("%s into the cut: %v", time.Since(cutAt).Round(time.Millisecond), fs)
				}
				if !gone {
					// The repair starts once n2's process is gone from etcd.
					reg, ok := registered(c, "n2")
					gone = ok && !reg
				}
				time.Sleep(50 * time.Millisecond)
			}
			if !gone {
				t.Fatalf("n2 stayed registered through %v of the cut with a TTL of %v", cutFor, ttl)
			}
			thaw()
			healed := time.Now()
			if tc.stopN2 {
				c.start(2)
			} else {
				waitRegistered(t, c, "n2", true, 20*time.Second, "n2 registered again")
			}
			waitUntil(t, 40*time.Second, "every replica live again", func() bool { return allLive(t, c) })
			t.Logf("every replica live %v after the heal", time.Since(healed).Round(time.Millisecond))
			from := []int{ws[0].count(), ws[1].count()}
			waitUntil(t, 15*time.Second, "writes through n1 and n3 after the heal", func() bool {
				return ws[0].count() >= from[0]+50 && ws[1].count() >= from[1]+50
			})
			stopWriters()
			for _, w := range ws {
				t.Logf("writer through n%d: %d acknowledged, %d failed (first: %s)", w.node, len(w.acked), w.failed, w.firstErr)
			}
			if fs := failed(); len(fs) > 0 {
				t.Fatalf("replicas of n1 or n3 failed: %v", fs)
			}
			checkDigests(t, cl, parts, 3)
			checkAcked(t, cl, parts, ws)
		})
	}
}

// TestRepairEndsAtThePeersFence: r repairs the tail of d, stopped, in a
// partition it holds with d and p, and p cannot be reached from r: the
// repair asks p again and again, its pause growing (here to 6 s), and
// the replica waits. Then p is cut from every peer and fenced. r's
// replica is then the partition's last live one and must take writes
// at once, not after the pause under way: it did only at the next ask,
// up to the whole pause after the fence. The fence for a cut between two
// nodes is off: it would fence p for its cut from r alone, before the
// pause grew.
func TestRepairEndsAtThePeersFence(t *testing.T) {
	const parts = 5
	const retryMax = 6 * time.Second
	c := newClusterWith(t, 5, 0, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.proxied, c.pairProxied, c.noCutFence = true, true, true
	})
	for id := 1; id <= 5; id++ {
		c.startCfg(id, func(cfg *Config) { cfg.knobs.repairRetryMax = retryMax })
	}
	const r = 1
	holders := holdersByPartition(t, c, 5)
	part, d, p := uint32(parts), 0, 0
	for q := range uint32(parts) {
		if hs := holders[q]; slices.Contains(hs, r) {
			others := slices.DeleteFunc(slices.Clone(hs), func(h int) bool { return h == r })
			part, d, p = q, others[0], others[1]
			break
		}
	}
	if part == parts {
		t.Fatalf("no partition on n%d: %v", r, holders)
	}
	cl := dialClient(t, c.direct(r))
	waitWritable(t, cl, parts)
	// d sequences the partition: r's replica tracks it, and waits for
	// its tail once it is gone.
	cld := dialClient(t, c.direct(d))
	for i := range 20 {
		upsertVia(t, cld, part, fmt.Sprintf("from-d-%d", i))
	}
	// Reset, not dropped: each ask fails at once and the pause between
	// asks is what the replica waits out (a dial into a drop is cut at
	// the fence already, repairFrom).
	rp := []*faultnet.Proxy{c.pairs[[2]int{r, p}], c.pairs[[2]int{p, r}]}
	for _, px := range rp {
		px.Reset(time.Minute)
	}
	healRP := func() {
		for _, px := range rp {
			px.Reset(0)
		}
	}
	defer healRP()
	c.stop(d)
	// r's repair asks p, unreachable, until the pauses reach retryMax;
	// two reporters (r and p of each other) fence no one.
	time.Sleep(retryMax)
	if fenceStands(c, NodeName(p)) {
		t.Fatalf("n%d fenced while cut from n%d only", p, r)
	}
	thawP := freezeAll(c.pathsOf(p))
	defer thawP()
	waitUntil(t, 20*time.Second, "p fenced", func() bool { return fenceStands(c, NodeName(p)) })
	fenced := time.Now()
	cl2 := dialClient(t, c.direct(r))
	upsertVia(t, cl2, part, "after-fence")
	took := time.Since(fenced)
	t.Logf("partition %d (holders %v; n%d stopped, n%d fenced): first write through n%d %v after the fence stood", part, holders[part], d, p, r, took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("the first write of partition %d came %v after n%d's fence, want it within 2 s (the repair's pause is %v)", part, took.Round(time.Millisecond), p, retryMax)
	}
	thawP()
	healRP()
	c.startCfg(d, func(cfg *Config) { cfg.knobs.repairRetryMax = retryMax })
	waitSettled(t, c, cl, parts, 3)
	checkDigests(t, cl, parts, 3)
}
