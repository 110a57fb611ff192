package partition

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

// Under churn that grows, shrinks and deletes rows, compaction keeps the
// arena within a constant factor of the live bytes.
func TestArenaStaysBoundedUnderChurn(t *testing.T) {
	for _, cfg := range []struct {
		name  string
		arena arenaConfig
		rows  int
		steps int
	}{
		{"small", smallArena, 200, 20000},
		{"default", defaultArenaConfig, 4000, 20000},
	} {
		t.Run("arena="+cfg.name, func(t *testing.T) {
			_, tab := newTestTable(t, kvSchema())
			tab.arena.cfg = cfg.arena
			rng := rand.New(rand.NewPCG(11, 12))
			val := func() string {
				n := rng.IntN(100)
				if rng.IntN(50) == 0 {
					n = rng.IntN(3 * cfg.arena.oversize)
				}
				return strings.Repeat("v", n)
			}
			for i := range cfg.rows {
				if _, err := tab.Insert(kvRow(int64(i), val())); err != nil {
					t.Fatal(err)
				}
			}
			compactions := 0
			for step := range cfg.steps {
				k := int64(rng.IntN(cfg.rows))
				s, live := tab.LookupValues([]wire.Value{wire.Int64(k)})
				was := tab.compacting
				switch {
				case !live:
					_, _ = tab.Insert(kvRow(k, val()))
				case rng.IntN(4) == 0:
					_ = tab.Delete(s)
				default:
					_ = tab.Update(s, kvRow(k, val()))
				}
				if !was && tab.compacting {
					compactions++
				}
				a := &tab.arena
				bound := 2*a.liveBytes + 4*a.cfg.chunkMax + 2*a.cfg.garbageMin
				if a.capBytes > bound {
					t.Fatalf("step %d: arena holds %d bytes for %d live (bound %d)", step, a.capBytes, a.liveBytes, bound)
				}
				if step%(cfg.steps/20) == 0 {
					mustVerify(t, tab)
				}
			}
			mustVerify(t, tab)
			if compactions == 0 {
				t.Fatal("no compaction ran")
			}
			t.Logf("%d compactions; arena %d of %d bytes live in %d chunks", compactions, tab.arena.liveBytes, tab.arena.capBytes, len(tab.arena.chunks))
		})
	}
}

// Deleting most rows of a large table gives the memory back.
func TestArenaReleasesAfterMassDelete(t *testing.T) {
	_, tab := newTestTable(t, kvSchema())
	const n = 30000
	for i := range n {
		if _, err := tab.Insert(kvRow(int64(i), strings.Repeat("x", 100))); err != nil {
			t.Fatal(err)
		}
	}
	full := tab.arena.capBytes
	for s := Slot(0); s < n; s++ {
		if s%10 != 0 {
			_ = tab.Delete(s)
		}
	}
	// Compaction advances with writes; give it some.
	for i := range n / 4 {
		s, _ := tab.Insert(kvRow(int64(n+i), "y"))
		_ = tab.Delete(s)
	}
	if tab.compacting {
		t.Fatal("compaction still running")
	}
	if got := tab.arena.capBytes; got > full/4 {
		t.Fatalf("arena holds %d bytes after deleting 90%% of %d", got, full)
	}
	mustVerify(t, tab)
}
