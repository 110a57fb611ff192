package node

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/layout"
)

// TestKillFencedByQuiet: a process that dies without a goodbye (a
// SIGKILL: its connections end, its record stands on its lease) is
// reported by every peer for a feed that ended while its record stood
// still (endedAndQuiet), not after suspectAfter, and fenced. Without the
// rule, each peer reported it "its feed here stays lost", 1.5 s after
// the end; the longest gap of writes through the others is logged.
func TestKillFencedByQuiet(t *testing.T) {
	const parts = 2
	var logs logCatch
	c := newClusterWith(t, 3, 2, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, func(c *cluster) {
		c.onLog = func(id int, r slog.Record) {
			switch {
			case id == 3:
			case strings.HasPrefix(r.Message, "node reported:"):
				logs.add("reports", id, r)
			case strings.HasPrefix(r.Message, "node fenced:"):
				logs.add("fences", id, r)
			}
		}
	})
	c.startCfg(3, func(cfg *Config) { cfg.knobs.crash = true })
	cl := dialClient(t, c.direct(1))
	waitWritable(t, cl, parts)
	ws, stopWriters := startFeedWriters(t, c, parts, []int{1, 2}, 2*time.Millisecond)
	defer stopWriters()
	waitWriting(t, ws, "writes through n1 and n2")

	killed := time.Now()
	c.stop(3)
	waitUntil(t, 15*time.Second, "n3 fenced", func() bool { return len(logs.seen("fences")) > 0 })
	fenced := time.Since(killed)
	waitUntil(t, 15*time.Second, "writes through n1 and n2 after the fence", func() bool {
		for _, w := range ws {
			w.mu.Lock()
			n := len(w.ackedAt)
			last := time.Time{}
			if n > 0 {
				last = w.ackedAt[n-1]
			}
			w.mu.Unlock()
			if !last.After(killed.Add(fenced)) {
				return false
			}
		}
		return true
	})
	end := time.Now()
	for _, w := range ws {
		w.mu.Lock()
		gap := longestGap(w.ackedAt, killed, end)
		w.mu.Unlock()
		t.Logf("writes through n%d: longest gap %v from the kill", w.node, gap.Round(time.Millisecond))
	}
	t.Logf("n3 fenced %v after it died: %v", fenced.Round(time.Millisecond), logs.seen("fences"))
	reports := logs.seen("reports")
	if len(reports) == 0 {
		t.Fatal("n3 fenced with no report logged")
	}
	for _, r := range reports {
		if !strings.Contains(r, `node="n3"`) || !strings.Contains(r, "record stands still") {
			t.Errorf("report %s: want n3's, for its feed's end while its record stood still", r)
		}
	}
}
