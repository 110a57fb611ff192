package node

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/layout"
)

// TestStartedCutOffRegistersOnceItReaches: three nodes, each holding a
// replica of every partition. n2 stops, and starts again while every path
// between it and its peers drops what it carries; it still reaches etcd.
// Registered at once, as it used to, it was alive in n1's and n3's views,
// and every call of every partition waited for a feed to it until they
// reported and fenced it, 1.5 s and more (rejoin chaos --net-faults on
// --seed 991340239 and --seed 20261208: 3.58 s and 3.16 s without a
// successful op). Now it registers only once it reaches its peers, after
// the heal, and writes through n1 and n3 never notice; then its replicas
// rejoin, and every replica ends live with one digest and every
// acknowledged write.
func TestStartedCutOffRegistersOnceItReaches(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 4
	const cut = 6 * time.Second
	// Writes every few ms: a second without one is a stall, where a
	// registration cut off stalled them for 1.5 s and more.
	const gapMax = time.Second
	var logs logCatch
	c, _ := newClusterN2ViaProxyWith(t, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.proxied, c.pairProxied = true, true
		c.onLog = func(id int, r slog.Record) {
			if id == 2 && r.Message == "not registering yet: a new process registers once it reaches its peers" {
				logs.add("waits", id, r)
			}
		}
	})
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	ws, stopWriters := startFeedWriters(t, c, parts, []int{1, 3}, 2*time.Millisecond)
	defer stopWriters()
	c.stop(2)
	from := []int{ws[0].count(), ws[1].count()}
	waitUntil(t, 15*time.Second, "writes through n1 and n3 with n2 stopped", func() bool {
		return ws[0].count() >= from[0]+100 && ws[1].count() >= from[1]+100
	})

	thaw := freezeAll(c.pathsOf(2))
	defer thaw()
	cutAt := time.Now()
	healed := time.AfterFunc(cut, thaw)
	defer healed.Stop()
	// n2's registration, watched from etcd while it starts.
	var mu sync.Mutex
	var registeredAt time.Time
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for time.Since(cutAt) < cut+15*time.Second {
			if reg, ok := registered(c, "n2"); ok && reg {
				mu.Lock()
				registeredAt = time.Now()
				mu.Unlock()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	c.start(2) // ready once registered
	<-watchDone
	mu.Lock()
	at := registeredAt
	mu.Unlock()
	t.Logf("n2 registered %v after it started, cut off for %v", at.Sub(cutAt).Round(time.Millisecond), cut)
	if at.IsZero() || at.Before(cutAt.Add(cut)) {
		t.Errorf("n2 registered %v into the %v cut, before it reached a peer", at.Sub(cutAt).Round(time.Millisecond), cut)
	}
	if len(logs.seen("waits")) == 0 {
		t.Errorf("n2 never said why it did not register")
	}
	for _, w := range ws {
		w.mu.Lock()
		gap := longestGap(w.ackedAt, cutAt, cutAt.Add(cut))
		w.mu.Unlock()
		t.Logf("writes through n%d while n2 started cut off: longest gap %v", w.node, gap.Round(time.Millisecond))
		if gap > gapMax {
			t.Errorf("writes through n%d went %v without an acknowledgement while n2 started cut off, want at most %v", w.node, gap.Round(time.Millisecond), gapMax)
		}
	}

	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	from = []int{ws[0].count(), ws[1].count()}
	waitUntil(t, 15*time.Second, "writes through n1 and n3 with every replica live", func() bool {
		return ws[0].count() >= from[0]+50 && ws[1].count() >= from[1]+50
	})
	stopWriters()
	checkDigests(t, cl, parts, 3)
	checkAcked(t, cl, parts, ws)
}
