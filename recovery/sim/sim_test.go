package sim

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seedsInTest is how many seeds plain `go test` runs; -short runs fewer.
const seedsInTest = 300

// replay is the command that replays one seed, for failure messages.
func replay(seed uint64) string { return fmt.Sprintf("go run ./cmd/rejoin sim --seed %d -v", seed) }

// TestSeeds runs seeds 1..300 across the CPUs and checks, beyond every
// seed passing, that together they exercise what the simulator claims to:
// every fault kind, throttling, late messages of superseded attempts,
// several catch-up rounds, cuts left to the stall timeout.
func TestSeeds(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	n := uint64(seedsInTest)
	if testing.Short() {
		n = 60
	}
	workers := uint64(max(1, runtime.GOMAXPROCS(0)))
	var mu sync.Mutex
	var results []Result
	t.Run("group", func(t *testing.T) {
		for wk := uint64(0); wk < workers; wk++ {
			t.Run(fmt.Sprintf("worker=%d", wk), func(t *testing.T) {
				t.Parallel()
				for seed := 1 + wk; seed <= n; seed += workers {
					r := Run(seed, Options{})
					if r.Err != nil {
						t.Errorf("seed %d: %v\nreplay: %s", seed, r.Err, replay(seed))
					}
					mu.Lock()
					results = append(results, r)
					mu.Unlock()
				}
			})
		}
	})
	if t.Failed() || testing.Short() {
		return
	}
	var c struct {
		throttled, roundBudget, stale, rounds, unnoticed, dropped, multiAttempt, deletes, twoTables, zstd int
		expired, claimLost, pausedLate, takeovers, takeoverStarts, guard, writesAfterLoss                 int
		touches, requeues, refused, staleResets, revokes, cutOffs                                         int
		regLosses, regLapses, regResumed, feedsBroken, joiners, settleWaits, kept, keptLapsed             int
		settledFailed, settleUnknown, failedOnRedial, missedOnly, resumed, graceOut, asks, leads, capped  int
		holdsGivenUp                                                                                      int
		feedsResumed, gapsFilled, resent, resumedMissed                                                   int
		refusedJoining, fenced, tailRepaired, dstTailRepaired                                             int
		regLossesAlone, settledAlone, refusedNoLive, refusedLogFull                                       int
		held, heldEnds                                                                                    int
		kinds                                                                                             [faultKinds]int
		phases                                                                                            [phases]int
	}
	for _, r := range results {
		s := r.Stats
		count := func(p *int, ok bool) {
			if ok {
				*p++
			}
		}
		count(&c.throttled, s.ThrottledTicks > 0)
		count(&c.roundBudget, s.TxnsHeldForRound > 0)
		count(&c.stale, s.StaleDelivered > 0)
		count(&c.rounds, s.Rounds > 1)
		count(&c.unnoticed, s.CutsUnnoticed > 0)
		count(&c.resumed, s.Resumed > 0)
		count(&c.asks, s.BeatAsks > 0)
		count(&c.leads, r.Knobs.BeatLeadTicks > 0 && s.BeatsAhead > 0)
		count(&c.capped, r.Knobs.PumpBlocksMax > 0 && s.PumpsCapped > 0)
		count(&c.graceOut, s.GraceExpired > 0)
		count(&c.holdsGivenUp, s.HoldsGivenUp > 0)
		count(&c.dropped, s.TxnsDropped > 0)
		count(&c.multiAttempt, r.Attempts > 1)
		count(&c.deletes, s.Deletes > 0)
		count(&c.twoTables, r.Knobs.Tables == 2)
		count(&c.zstd, r.Knobs.Codec == wire.CodecZstd)
		count(&c.touches, s.Touches > 0)
		count(&c.requeues, s.Requeues > 0)
		count(&c.refused, s.HellosRefused > 0)
		count(&c.staleResets, s.StaleResets > 0)
		count(&c.revokes, s.Revokes > 0)
		count(&c.cutOffs, s.CutOffs > 0)
		count(&c.regLosses, s.RegLosses > 0)
		count(&c.regLapses, s.RegLapses > 0)
		count(&c.regResumed, s.RegLosses > 0 && s.RegLapses == 0 && s.SettledKept > 0)
		count(&c.feedsBroken, s.FeedsBroken > 0)
		count(&c.joiners, s.Joiners > 0)
		count(&c.settleWaits, s.SettleWaits > 0)
		count(&c.kept, s.SettledKept > 0)
		count(&c.keptLapsed, s.SettledKept > 0 && s.RegLapses > 0)
		count(&c.settledFailed, s.SettledFailed > 0)
		count(&c.settleUnknown, s.SettleUnknown > 0)
		count(&c.failedOnRedial, s.FailedOnRedial > 0)
		count(&c.feedsResumed, s.FeedsResumed > 0)
		count(&c.gapsFilled, s.GapsFilled > 0)
		count(&c.resent, s.TxnsResent > 0)
		count(&c.resumedMissed, s.FailedOnResumeMissed > 0)
		count(&c.missedOnly, s.SettledFailed > 0 && s.SettleUnknown == 0 && s.FailedOnRedial == 0)
		count(&c.refusedJoining, s.RefusedJoining > 0)
		count(&c.regLossesAlone, s.RegLossesAlone > 0)
		count(&c.settledAlone, s.SettledAlone > 0)
		count(&c.refusedNoLive, s.RefusedNoLive > 0)
		count(&c.refusedLogFull, s.RefusedLogFull > 0)
		count(&c.held, s.Held > 0)
		count(&c.heldEnds, s.HeldEnds > 0)
		// A run ends held only with a replica held, and counts what each
		// one held at the end lacks only then.
		if (s.HeldEnds > 0 || s.HeldLacking > 0) && s.Held == 0 {
			t.Errorf("seed %d: ended held %d times, %d txns lacking, with no replica held", r.Seed, s.HeldEnds, s.HeldLacking)
		}
		count(&c.fenced, s.Fenced > 0)
		count(&c.tailRepaired, s.TailTxnsRepaired > 0)
		count(&c.dstTailRepaired, s.DstTailTxnsRepaired > 0)
		count(&c.expired, s.ClaimsExpired > 0)
		count(&c.claimLost, s.ClaimLostStops > 0)
		count(&c.pausedLate, s.PausedLate > 0)
		count(&c.takeovers, s.Takeovers > 0)
		count(&c.takeoverStarts, s.TakeoverStarts > 0)
		count(&c.guard, r.Knobs.LeaseGuard)
		count(&c.writesAfterLoss, s.WritesAfterLoss > 0)
		if r.Knobs.LeaseGuard && s.DualWriteTicks > 0 {
			t.Errorf("seed %d: with the lease guard, %d ticks with two writers", r.Seed, s.DualWriteTicks)
		}
		for k, v := range s.Kinds {
			count(&c.kinds[k], v > 0)
		}
		for p, v := range s.Phases {
			count(&c.phases[p], v > 0)
		}
		// Each stale message a running processor got, it must have counted
		// as rejected.
		if s.StaleRejected < s.StaleToRunning {
			t.Errorf("seed %d: %d stale messages reached running processors, %d counted as rejected", r.Seed, s.StaleToRunning, s.StaleRejected)
		}
		// Invariant (d) for the paused holders' late messages, by count.
		if s.PausedRejected != s.PausedLate || s.StaleAccepted != 0 {
			t.Errorf("seed %d: %d late messages of paused holders reached running processors, %d rejected; %d stale accepted", r.Seed, s.PausedLate, s.PausedRejected, s.StaleAccepted)
		}
		if s.Claims != r.Attempts+s.StartsRefused {
			t.Errorf("seed %d: %d claims for %d attempts and %d starts refused", r.Seed, s.Claims, r.Attempts, s.StartsRefused)
		}
	}
	t.Logf("of %d seeds: %+v", n, c)
	want := func(what string, got, min int) {
		if got < min {
			t.Errorf("only %d of %d seeds with %s, want >= %d", got, n, what, min)
		}
	}
	want("the throttle engaged", c.throttled, 10)
	want("a txn held for its catch-up round's budget", c.roundBudget, 10)
	want("a superseded attempt's message delivered to a newer one", c.stale, 10)
	want("several catch-up rounds", c.rounds, 60)
	want("a cut side left to time out", c.unnoticed, 5)
	want("an attempt resumed on a new connection after a cut", c.resumed, 10)
	want("a source's redials out of their grace", c.graceOut, 5)
	t.Logf("sources that gave up holding their partition for a destination out of reach: %d runs", c.holdsGivenUp)
	want("heartbeats on demand (Initiator.BeatPast)", c.asks, 100)
	want("heartbeats leading the clock (InitiatorConfig.BeatLeadMillis)", c.leads, 100)
	want("source pumps stopped at SourceConfig.PumpBlocksMax", c.capped, 60)
	want("buffered txns dropped at handoff", c.dropped, 150)
	want("several attempts", c.multiAttempt, 60)
	want("deletes shipped in catch-up", c.deletes, 60)
	want("two tables", c.twoTables, 60)
	want("zstd frames", c.zstd, 30)
	want("a claim expired", c.expired, 20)
	want("a holder stopped on finding its claim lost", c.claimLost, 5)
	want("a paused holder's late message rejected by a newer attempt", c.pausedLate, 5)
	want("a supervisor failover", c.takeovers, 10)
	want("a new leader starting an attempt from the record alone", c.takeoverStarts, 5)
	want("the lease guard", c.guard, 100)
	want("a task record touched on progress (claim.Guard.MaybeTouch)", c.touches, 100)
	want("an attempt requeued by its holder", c.requeues, 30)
	want("a task reset by the health task (claim.StaleReason)", c.staleResets, 10)
	want("a claim revoked by the supervisor (supervise.Decide, a dead source)", c.revokes, 3)
	want("a source node cut off from a coordinator that ran on", c.cutOffs, 3)
	// A source node that lost its registration (registration.go), and
	// what its settlement (recovery.Settle) decided.
	want("a source node's registration lost", c.regLosses, 40)
	want("a lost registration lapsed", c.regLapses, 25)
	want("a lost registration resumed on its lease, its replica kept", c.regResumed, 5)
	want("a lapsed node's replica kept live (every feed open throughout)", c.keptLapsed, 10)
	want("an initiator's feed to a node away broken", c.feedsBroken, 5)
	// Feeds that break and resume (feedbreak.go): 300 seeds gave 108
	// resumed, 77 with a resend, 26 of them filling a gap of txns lost in
	// flight, 27 failed for a hello's Missed, 1 refused. A broken feed's
	// full log takes no more (recovery.ErrFeedLogFull): before, it dropped
	// its oldest and 13 were refused, 14 failed for a Missed.
	want("a broken feed resumed (Initiator.FeedResumed)", c.feedsResumed, 50)
	want("a resumed feed's log resent", c.resent, 40)
	want("a resend that filled txns lost in flight", c.gapsFilled, 10)
	want("a resumed feed's replica failed for its hello's Missed", c.resumedMissed, 5)
	// An open feed's log no longer drops what its node has not read
	// (recovery.ErrFeedLogFull refuses the call instead), so no resume
	// is refused: before, 1 or more seeds of 300 failed a replica so.
	if c.failedOnRedial > 0 {
		t.Errorf("%d of %d seeds failed a replica on a redial that could not resume", c.failedOnRedial, n)
	}
	// A call refused for the only live replica's broken feed's full log
	// (recovery.ErrFeedLogFull) came in none of the 300: its scenario is
	// feed-resume.txt's second part.
	want("a new initiator process registered while a node was away", c.joiners, 10)
	want("a settlement waiting for a feed", c.settleWaits, 5)
	want("a replica failed for the partitions a hello named (alone)", c.missedOnly, 3)
	// Joins (Knobs.Joins) and silences (silent.go): 300 seeds gave 300
	// with a txn refused while a join was not answered, 59 with an
	// initiator fenced, 9 of them with its tail repaired into a source
	// node from another, 21 into the destination.
	want("a txn refused while a join was not answered", c.refusedJoining, 250)
	// The only live replica lapsing (regLossPlan.alone), kept by
	// recovery.Settle's rule 6: 300 seeds gave 2 and 1.
	want("a lost registration of the only live replica", c.regLossesAlone, 1)
	want("the only live replica kept by its settlement", c.settledAlone, 1)
	// A replica held (holds.go) in none of the 300, nor of 20,000 from
	// 811000000 or from 1: the fault plan keeps a source live whenever
	// one may fail. Its scenario is hold.txt; its check's check,
	// TestSabotageHoldIsCaught.
	t.Logf("runs with a replica held: %d, ended held: %d", c.held, c.heldEnds)
	want("an initiator silenced and fenced", c.fenced, 40)
	want("a fenced initiator's tail repaired into a source node", c.tailRepaired, 5)
	want("a fenced initiator's tail repaired into the destination", c.dstTailRepaired, 10)
	// Without the guard, a woken holder acts until its guard's first look.
	want("a write accepted after its holder's claim was lost", c.writesAfterLoss, 2)
	for k, got := range c.kinds {
		want("fault "+faultKind(k).String(), got, 10)
	}
	for p, got := range c.phases {
		want("a fault in the "+phase(p).String(), got, 10)
	}
}

// TestReplay: a seed run twice gives the same trace, byte for byte, and
// the trace does not change the run.
func TestReplay(t *testing.T) {
	defer goleak.VerifyNone(t)
	// 129: a supervisor failover and a source node's death, whose new
	// leader moves the task to the other source; 79: a source node's
	// death; 4711: a paused holder.
	for _, seed := range []uint64{1, 9, 13, 19, 79, 129, 151, 4711} {
		a := Run(seed, Options{Trace: true})
		b := Run(seed, Options{Trace: true})
		c := Run(seed, Options{})
		if a.Err != nil {
			t.Fatalf("seed %d: %v\nreplay: %s", seed, a.Err, replay(seed))
		}
		if len(a.Trace) < 50 {
			t.Fatalf("seed %d: a trace of %d lines", seed, len(a.Trace))
		}
		if ta, tb := strings.Join(a.Trace, "\n"), strings.Join(b.Trace, "\n"); ta != tb {
			i := 0
			for i < min(len(a.Trace), len(b.Trace)) && a.Trace[i] == b.Trace[i] {
				i++
			}
			t.Fatalf("seed %d: traces differ at line %d:\n%s\n%s", seed, i, at(a.Trace, i), at(b.Trace, i))
		}
		for _, r := range []Result{b, c} {
			if r.Ticks != a.Ticks || r.FinalTxn != a.FinalTxn || r.FinalDigest != a.FinalDigest || r.Stats != a.Stats || r.Knobs != a.Knobs {
				t.Fatalf("seed %d: runs differ: %+v\nvs %+v", seed, a, r)
			}
		}
	}
}

func at(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(end)"
}

// TestEquivalence (docs/STYLE.md rule 15): the same seeded workload, rejoined
// with blocks of one row, 64 KiB and 4 MiB, with and without compression,
// ends with every replica at the same final txn with the same digest.
// Faults and network timing differ between the variants (they follow the
// number of frames), the outcome must not.
func TestEquivalence(t *testing.T) {
	defer goleak.VerifyNone(t)
	type variant struct {
		block int
		codec wire.Codec
	}
	variants := []variant{
		{1, wire.CodecNone}, {1, wire.CodecS2},
		{64 << 10, wire.CodecNone}, {64 << 10, wire.CodecS2},
		{4 << 20, wire.CodecNone}, {4 << 20, wire.CodecS2},
		{64 << 10, wire.CodecZstd},
	}
	seeds := []uint64{2, 3, 4, 5}
	if testing.Short() {
		seeds = seeds[:1]
	}
	const workloadTicks = 3000
	for _, seed := range seeds {
		var first Result
		var blocks []int64
		for i, v := range variants {
			r := Run(seed, Options{Tweak: func(k *Knobs) {
				k.BlockBytesMax, k.Codec = v.block, v.codec
				k.WorkloadTicks, k.LiveTicks = workloadTicks, 0
				// A small feed log refuses calls while its node has not
				// acknowledged (recovery.ErrFeedLogFull), which the
				// stream's timing decides: the txns taken would differ.
				k.FeedLogBytesMax = 0
			}})
			if r.Err != nil {
				t.Fatalf("seed %d, block %d B, codec %s: %v", seed, v.block, v.codec, r.Err)
			}
			if r.LiveTick >= workloadTicks {
				t.Fatalf("seed %d, block %d B, codec %s: live at tick %d, after the workload ended at %d: the final txn would differ", seed, v.block, v.codec, r.LiveTick, workloadTicks)
			}
			blocks = append(blocks, r.Stats.Snapshot)
			if i == 0 {
				first = r
				continue
			}
			if r.FinalTxn != first.FinalTxn || r.FinalDigest != first.FinalDigest {
				t.Fatalf("seed %d: block %d B, codec %s ends at %v with digest %016x; block %d B, codec %s at %v with %016x",
					seed, v.block, v.codec, r.FinalTxn, r.FinalDigest, variants[0].block, variants[0].codec, first.FinalTxn, first.FinalDigest)
			}
		}
		if first.FinalDigest == 0 || slices.Contains(blocks, 0) {
			t.Fatalf("seed %d: nothing was streamed (%v snapshot rows per variant)", seed, blocks)
		}
		t.Logf("seed %d: %d variants end at %v with digest %016x", seed, len(variants), first.FinalTxn, first.FinalDigest)
	}
}

// TestSabotageIsCaught: a destination changed behind the protocol's back
// fails invariant (a). The check that the checks work.
func TestSabotageIsCaught(t *testing.T) {
	defer goleak.VerifyNone(t)
	for seed := uint64(1); seed <= 5; seed++ {
		r := Run(seed, Options{Sabotage: SabotageDestinationWrite})
		v, ok := r.Err.(*Violation)
		if !ok || v.Check != "a" {
			t.Fatalf("seed %d: sabotaged run ended with %v, want a violation of invariant a", seed, r.Err)
		}
	}
}

// TestSabotageClaimLossIsCaught: holders blind to a lost claim fail
// invariant (e) on seeds where a paused holder lost its claim and its
// destination processor would have run on (on the others it ends anyway,
// told by its source, and the blind check does no harm).
func TestSabotageClaimLossIsCaught(t *testing.T) {
	defer goleak.VerifyNone(t)
	lost, caught := 0, 0
	// With the claim on the source and two sources to rejoin from, a
	// blind holder's attempt mostly ends by its destination's word first
	// (superseded by the other source's attempt): the first seed caught is
	// 443.
	for seed := uint64(1); seed <= 1000; seed++ {
		if Run(seed, Options{}).Stats.ClaimLostStops == 0 {
			continue
		}
		lost++
		r := Run(seed, Options{Sabotage: SabotageIgnoreClaimLoss})
		if r.Err == nil {
			continue
		}
		if v, ok := r.Err.(*Violation); !ok || v.Check != "e" {
			t.Fatalf("seed %d: sabotaged run ended with %v, want a violation of invariant e or none", seed, r.Err)
		}
		caught++
	}
	t.Logf("%d of %d seeds with a lost claim caught", caught, lost)
	if caught < 3 {
		t.Fatalf("only %d of %d seeds with a lost claim caught the blind holders", caught, lost)
	}
}

// TestSabotageSettleIsCaught: a settlement that does not hear what the
// initiators' hellos said they sent without a feed to a node away
// (wire.Hello.Missed) keeps a replica that missed txns live, and
// the run must fail: by invariant (a), the replica, or a destination
// rebuilt from it, differing from the oracle at a common txn; or, when
// the last txn sent is one it never got, by never finishing (c). On the
// other seeds with a lost registration the replica missed nothing, or
// the joiner could not say and every replica fails anyway.
func TestSabotageSettleIsCaught(t *testing.T) {
	settleSabotageCaught(t, SabotageSettleMissed, "a lost registration", "the deaf settlement", 5,
		func(s Stats) bool { return s.RegLosses > 0 })
}

// TestSabotageSettleAloneIsCaught: a settlement told that no other
// replica was live during the outage (recovery.SettleInput.Others empty)
// keeps a replica that missed txns the other source node acknowledged,
// from a new initiator process that cannot say, or is not waited for,
// and the run must fail as TestSabotageSettleIsCaught's does. Where the
// replica is truly alone (regLossPlan.alone), the same keep is right.
func TestSabotageSettleAloneIsCaught(t *testing.T) {
	settleSabotageCaught(t, SabotageSettleAlone, "a new initiator process during a lapse", "the settlement that took every replica for alone", 3,
		func(s Stats) bool { return s.Joiners > 0 })
}

// TestSabotageHoldIsCaught: replicas told that no other replica is live
// when they are lost for txns they may lack (recovery.Replica.Lose) are
// held where they must fail, to be rebuilt from the live one, and
// invariant (f) must fail on every seed that loses a replica so: a
// settlement that fails one, a resumed feed's hello naming the
// partition, a feed re-opened without resuming.
func TestSabotageHoldIsCaught(t *testing.T) {
	defer goleak.VerifyNone(t)
	seeds := 0
	for seed := uint64(1); seed <= 300; seed++ {
		r := Run(seed, Options{})
		if r.Err != nil {
			t.Fatalf("seed %d: %v\nreplay: %s", seed, r.Err, replay(seed))
		}
		if s := r.Stats; s.SettledFailed+s.FailedOnResumeMissed+s.FailedOnRedial == 0 {
			continue
		}
		seeds++
		s := Run(seed, Options{Sabotage: SabotageHoldAlways})
		if v, ok := s.Err.(*Violation); !ok || v.Check != "f" {
			t.Fatalf("seed %d: sabotaged run ended with %v, want a violation of invariant f", seed, s.Err)
		}
	}
	t.Logf("%d seeds lost a replica with another live: every one caught the replicas held all the same", seeds)
	if seeds < 10 {
		t.Fatalf("only %d seeds lost a replica with another live", seeds)
	}
}

// settleSabotageCaught runs seeds 1..300, and again with sab each seed
// whose plain run's stats pass with: the sabotaged run must fail by
// invariant (a), the replica, or a destination rebuilt from it,
// differing from the oracle at a common txn, or, when the last txn sent
// is one it never got, by never finishing (c), or not at all; and the
// failures must number at least least.
func settleSabotageCaught(t *testing.T, sab Sabotage, with, what string, least int, sel func(Stats) bool) {
	t.Helper()
	defer goleak.VerifyNone(t)
	seeds, caught := 0, 0
	for seed := uint64(1); seed <= 300; seed++ {
		r := Run(seed, Options{})
		if r.Err != nil {
			t.Fatalf("seed %d: %v\nreplay: %s", seed, r.Err, replay(seed))
		}
		if !sel(r.Stats) {
			continue
		}
		seeds++
		s := Run(seed, Options{Sabotage: sab})
		if s.Err == nil {
			continue
		}
		if v, ok := s.Err.(*Violation); !ok || (v.Check != "a" && !strings.Contains(v.Msg, "not finished")) {
			t.Fatalf("seed %d: sabotaged run ended with %v, want a violation of invariant a, a run that never finished, or none", seed, s.Err)
		}
		caught++
	}
	t.Logf("%d of %d seeds with %s caught %s", caught, seeds, with, what)
	if caught < least {
		t.Fatalf("only %d of %d seeds with %s caught %s", caught, seeds, with, what)
	}
}

// regressionSeeds are seeds that once failed, each kept with what it
// caught, so a change that brings the failure back fails plain `go test`
// and not only a long `rejoin sim` run.
var regressionSeeds = []struct {
	seed uint64
	why  string
}{
	// One-byte blocks, a window of one block: writes outpaced shipping and
	// every catch-up round shipped as much as the one before (the pace in
	// txns per tick was above the write rate), so no attempt finished in
	// 30,000 ticks. The round budget (cow's throttle) halves the rounds.
	{239863, "1-byte blocks, window 1: catch-up rounds did not shrink"},
	{295540, "1-byte blocks, window 1: catch-up rounds did not shrink"},
	{296853, "1-byte blocks, window 1: catch-up rounds did not shrink"},
	// The destination node restarted, and its executor died holding the
	// claim (before issue 11 the claim was held on the destination). The
	// arrangement changed and the seed no longer draws that case;
	// TestUnreleasedClaimAtEnd keeps its kind: a claim nobody gives back,
	// left to run out at the end.
	{292768, "a dead executor's claim still within its lease at the end"},
	// The destination, live, was cut off from the coordinator through its
	// completion; the health task reset the task, and the attempts that
	// followed were refused at the hello (the replica is live). They do
	// no work, and the faults' bound counted them (CI, start 230257141).
	{230303601, "attempts refused at the hello by a live replica counted against the faults' bound"},
	// A new initiator process joined a source node while its attempt was
	// handing off: the replica's tracker started the joiner at Zero, so
	// the source handed off at E with its safe point at Zero, though the
	// joiner's IDs start above its feed's floor (CI, start 369235985).
	// The tracker now starts a joiner at the floor (Replica.AddInitiator).
	{369240632, "a joiner's feed opened at a source mid-handoff: safe point at Zero"},
	{369292618, "a joiner's feed opened at a source mid-handoff: safe point at Zero"},
	{369327391, "a joiner's feed opened at a source mid-handoff: safe point at Zero"},
	{369327652, "a joiner's feed opened at a source mid-handoff: safe point at Zero"},
	{369334450, "a joiner's feed opened at a source mid-handoff: safe point at Zero"},
	// The source node lost its registration just after its hello: its
	// holder stopped before its source processor started and closed the
	// connection, but the model told the destination nothing, which
	// timed out with no fault to explain it (CI, start 369235985).
	{369274146, "a holder stopped before its source started: the destination was not told"},
	// The source node's replica failed (a feed re-opened by the same
	// process) between its hello and the destination's answer: its
	// StartSource was refused, which the model took for a bad
	// configuration instead of the attempt's end (start 1500000000).
	{1500053244, "a source's replica failed between its hello and the answer"},
	// A joiner's feed opened at the source while it streamed: its floor
	// was the last txn the source executed, below the boundary S the
	// source had set on its safe point with few txns flowing, and the
	// joiner's heartbeat came between the two (CI, start 728888228). The
	// floor is now the highest safe point read (Replica.JoinFloor).
	{728888924, "a joiner's floor below the source's boundary: the last txn executed, not the safe point"},
	// A resume dial's hello carries the log's Kept as it stands at the
	// dial; the log went on taking txns until the answer, and one that
	// overflowed meanwhile dropped txns above the point the receiver read.
	// The receiver resumed (its point at or above the hello's Kept), and
	// FeedResumed resent what the log still held: the dropped txns never
	// reached the replica, which stayed live (sweep of 20,000 seeds, all
	// 7 failures; seed 5238: i1's txn t1113.c2.i1 logged in the gap, the
	// redial at tick 75 with Kept t1083.c9.i1 below the node's
	// t1083.c11.i1, t1113.c3.i1 pushing it out of a 130-byte log at tick
	// 76, the resume at tick 77 resending t1113.c3.i1 alone). The core now
	// closes such a feed at once, and the next redial is refused.
	{5238, "a resume whose log dropped txns above the receiver's point while the dial was out"},
	{7867, "likewise"},
	{8828, "likewise"},
	{10772, "likewise"},
	{10881, "likewise"},
	{14227, "likewise"},
	{19015, "likewise"},
	// Two breaks of i1's feed to the source, 39 and 27 ticks out of reach
	// with one tick open between them, kept the source awaiting its
	// boundary past its 67-tick stall window; the model took the timeout
	// for a bug, since either gap alone stays under the window (CI, start
	// 934334624). Breaks that compound now explain a timeout.
	{934334737, "two feed breaks into the source in a row: the timeout was the faults'"},
	// The same with the first gap begun before the attempt: counted only
	// from the attempt's start, one break was seen and the timeout taken
	// for a bug (found on 5d1387b, which it fails too).
	{1300001662, "a feed out since before the attempt, then another break"},
	// The only live replica (the other source node dead) lost its
	// registration while a small feed log overflowed on a broken feed to
	// it: the replica failed for the txns it named missed, acknowledged
	// nowhere, and no replica was left; the run never finished. A broken
	// feed's full log now takes no more, and a call whose only live
	// replica is behind it is refused (recovery.ErrFeedLogFull).
	{3014971, "the only live replica lapsed with a feed log overflowing: nothing left to rejoin from"},
	// An open feed's small log dropped its oldest, sent and not yet
	// acknowledged, and broke with one of them in flight: the partition's
	// only live replica, kept by its lapse's settlement, failed on the
	// resume it could not take, and the rejoin never ended. An open
	// feed's full log now refuses the call instead.
	{2031481811, "an open feed's log dropped what the only live replica had not read"},
	// A joiner whose calls were all refused (a holder out of its view)
	// never joined the partition anywhere, but its feed to the
	// destination node was open when an attempt began there: the
	// simulator's executor tracked every initiator with an open feed, not
	// only those the replica core tracks, and the live destination waited
	// for the joiner for good (found by CI's range for ffa07f6; a latent
	// bug of the simulator, which the timing of 5d1387b did not meet).
	{2141312834, "a destination's new executor tracked a joiner that never joined there"},
	// A resume the core closed at once (a txn missed there while the dial
	// was out) was taken for a new break of up to 53 ticks, and the
	// replica was not failed for what the hello named: the source waited
	// out its stall window for the initiator, with no fault to explain it
	// (CI start 2136613441, on the full log's change). The node fails what
	// the hello names as it resumes, and the core redials at once.
	{2136638235, "a resume closed at once: the hello's Missed not heard, the redial taken for a break"},
	// An initiator's core closed its open feed to a source node taken for
	// dead, its log full (Submit); the world ignored that close and left
	// it pending, and the feed's next resume took it for its own: it broke
	// the resumed feed after the core had resent its log on it, and the
	// source read the resend and the next resume's (found on 1c2cd99 by
	// rejoin sim --seeds 20000 --start 1490223841; a latent bug of the
	// simulator: the node closes the connection when the core asks).
	{1490228980, "a feed closed by its sender outside a resume, taken for the next resume's close"},
	// A first cut of the held replicas (holds.go) marked a replica out of
	// the run only after draining its core: the check at its aborted
	// source's end stepped a replica that had just failed, and found a
	// txn its safe point allowed left unrun.
	{811000412, "a failed replica marked out of the run after its source's end was checked"},
}

// TestRegressionSeeds replays every seed that once failed.
func TestRegressionSeeds(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, rs := range regressionSeeds {
		t.Run(fmt.Sprintf("seed=%d", rs.seed), func(t *testing.T) {
			if r := Run(rs.seed, Options{}); r.Err != nil {
				t.Fatalf("%s: %v\nreplay: %s", rs.why, r.Err, replay(rs.seed))
			}
		})
	}
}

// TestUnreleasedClaimAtEnd: seed 87's coordinator goes out just before
// the handoff and stays out past it: both completions fail (the
// destination's lands once the coordinator is back) and the holder's
// release too, so its claim stays until its lease runs out, after the
// outage. The run must not end before it does (the final check wants no
// claim left), however soon after the handoff the workload stops:
// LiveTicks sweeps the end of the run across the lease's expiry (the
// workload stops LiveTicks after the handoff). The seed was 119 until the
// initiators became the product's core (a new feed's first heartbeat at
// the first tick moved the network's draws).
func TestUnreleasedClaimAtEnd(t *testing.T) {
	defer goleak.VerifyNone(t)
	const seed = 87
	for live := 0; live <= 150; live += 5 {
		r := Run(seed, Options{Tweak: func(k *Knobs) { k.WorkloadTicks, k.LiveTicks = 0, live }})
		if r.Err != nil {
			t.Fatalf("seed %d with LiveTicks %d: %v", seed, live, r.Err)
		}
		if r.Stats.ClaimsExpired != 1 || r.Stats.Kinds[faultOutage] != 1 || r.Attempts != 1 {
			t.Fatalf("seed %d with LiveTicks %d: %d claims expired, %d outages, %d attempts, want 1 each: the case is gone", seed, live, r.Stats.ClaimsExpired, r.Stats.Kinds[faultOutage], r.Attempts)
		}
	}
}
