package cow

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// propertyConfig is the property test's stream config: a log small enough
// that the workload meets the hold and the pace, with a reserve above what
// any of its txns adds.
func propertyConfig(blockBytes int) Config {
	return Config{
		BlockBytesMax:        blockBytes,
		ChangeLogBytesMax:    256,
		ChangeLogTxnBytesMax: 96,
		PaceLowWaterBytes:    64,
		ThrottleWindowTicks:  4,
		PaceTxnsPerTick:      6,
	}
}

const (
	propertyTxns      = 200
	propertySteps     = 100_000 // a run that takes more has stopped making progress
	propertySeeds     = 300
	propertySeedsRace = 200 // under -race, to stay near 10 s on two cores
	propertySeedsFast = 40  // with -short
)

// propertyResult is what one run of a seed ended with.
type propertyResult struct {
	digest  uint64
	content string
	m       Metrics
}

// runProperty runs one seed: load a source, activate a stream, then
// interleave, as a second seeded PCG decides, the workload's txns through
// the executor (gated by the stream), blocks cut and applied to an empty
// destination, round starts and ticks; then a final delta with nothing
// running. It fails unless the destination ends equal to the source.
func runProperty(t *testing.T, seed uint64, rows []loadRow, work []invocation, cfg Config) propertyResult {
	t.Helper()
	src := newSource(t)
	loadInto(t, src.p, rows)
	dst := newTestPartition(t)

	s, sh := activate(t, src.p, dst, cfg)
	src.ex.SetGate(s)
	sched := rand.New(rand.NewPCG(seed, 2))
	offered, executed := 0, 0
	for step := 0; executed < len(work); step++ {
		if step > propertySteps {
			t.Fatalf("no progress after %d steps: %d of %d txns executed, phase %v, log %d bytes, metrics %+v",
				step, executed, len(work), s.Phase(), s.LogBytes(), s.Metrics())
		}
		switch r := sched.IntN(100); {
		case r < 55:
			if offered < len(work) && src.ex.Queued() < 4 {
				src.offer(t, work[offered])
				offered++
			}
			if _, ran := src.ex.Step(); ran {
				executed++
			}
		case r < 93:
			if !sh.next() && s.Phase() == PhaseBetweenRounds && sched.IntN(3) == 0 {
				if err := s.StartRound(); err != nil {
					t.Fatal(err)
				}
			}
		default:
			s.Tick()
		}
		if n := s.LogBytes(); n > cfg.ChangeLogBytesMax && s.Metrics().TxnsOverReserve == 0 {
			t.Fatalf("log holds %d bytes, bound %d, and no txn passed the reserve", n, cfg.ChangeLogBytesMax)
		}
	}
	// Nothing runs from here on: a few more rounds, then the handoff.
	sh.drain()
	for range sched.IntN(3) {
		sh.round()
	}
	sh.finish(src.p)
	m := s.Metrics()
	if m.TxnsOverReserve != 0 || m.LogBytesPeak > cfg.ChangeLogBytesMax {
		t.Fatalf("%d txns over the reserve, log peak %d of %d", m.TxnsOverReserve, m.LogBytesPeak, cfg.ChangeLogBytesMax)
	}
	return propertyResult{digest: src.p.Digest(), content: content(src.p), m: m}
}

// TestStreamProperty is the table stream's proof: for every seed, a
// rejoin under a random interleaving of txns, blocks, rounds and ticks
// ends with the destination holding exactly the source's rows, and the
// same workload ends with the same digest whatever the block size: one
// row, 64 KiB, 4 MiB, and a size drawn from the seed.
func TestStreamProperty(t *testing.T) {
	seeds := propertySeeds
	if raceEnabled {
		seeds = propertySeedsRace
	}
	if testing.Short() {
		seeds = propertySeedsFast
	}
	var cover struct{ held, paced, dropped, gone, rounds, overBlocks int64 }
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("replay: go test ./cow/ -run 'TestStreamProperty/seed=%d$' -v", seed)
				}
			})
			sizes := []int{1, 64 << 10, 4 << 20, 1 + rand.New(rand.NewPCG(seed, 3)).IntN(2000)}
			g := gen{rng: rand.New(rand.NewPCG(seed, 1))}
			rows := g.load()
			work := g.workload(t, propertyTxns)
			var first propertyResult
			for i, size := range sizes {
				r := runProperty(t, seed, rows, work, propertyConfig(size))
				if i == 0 {
					first = r
				} else if r.digest != first.digest || r.content != first.content {
					t.Fatalf("BlockBytesMax %d ends with digest %016x, BlockBytesMax %d with %016x", size, r.digest, sizes[0], first.digest)
				}
				cover.held += r.m.TxnsHeld
				cover.paced += r.m.TxnsPaced
				cover.dropped += r.m.DeletesDropped
				cover.gone += r.m.UpsertsGone
				cover.rounds += int64(r.m.Rounds)
				cover.overBlocks += r.m.Upserts.Blocks + r.m.Deletes.Blocks
			}
		})
	}
	t.Logf("over %d seeds: %d txns held, %d paced, %d deletes dropped, %d upserts gone, %d rounds, %d round blocks",
		seeds, cover.held, cover.paced, cover.dropped, cover.gone, cover.rounds, cover.overBlocks)
	// The runs must have met every rule the test is there to prove.
	if cover.held == 0 || cover.paced == 0 || cover.dropped == 0 || cover.gone == 0 {
		t.Fatalf("the workload never met some rule: %+v", cover)
	}
}
