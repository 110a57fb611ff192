package sim

import (
	"strings"
	"testing"
)

// TestFencingSeeds runs the fence decision (supervise.Fencer, CutDue,
// MayRegister) under each seed's network faults, three to seven nodes,
// and holds it to its promises (fencing.go).
func TestFencingSeeds(t *testing.T) {
	seeds := uint64(1500)
	if testing.Short() || raceEnabled {
		seeds = 300
	}
	var fences, cuts, resolved, worst int
	for seed := uint64(1); seed <= seeds; seed++ {
		k := DefaultFenceKnobs()
		k.Nodes = 3 + int(seed%5)
		res := RunFencing(seed, k)
		if res.Err != nil {
			t.Fatalf("seed %d, %d nodes: %v\n%s", seed, k.Nodes, res.Err, strings.Join(res.Trace, "\n"))
		}
		fences += res.Fences
		cuts += res.CutFences
		resolved += res.Resolved
		worst = max(worst, res.ResolveMax)
	}
	t.Logf("%d seeds: %d fences, %d of them a cut's; %d faults resolved within the bound, the slowest in %d ticks", seeds, fences, cuts, resolved, worst)
	if cuts == 0 || resolved == 0 {
		t.Fatal("no cut's fence, or no fault that had to be resolved: the faults drawn test nothing")
	}
}
