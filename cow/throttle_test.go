package cow

import (
	"math/rand/v2"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// behindSetup returns a source with n ints rows 0..n-1 in slots 0..n-1
// and a stream whose snapshot is shipped, so every change is logged.
func behindSetup(t *testing.T, n int, cfg Config) (src *partition.Partition, s *Stream, sh *shipper) {
	t.Helper()
	src = newTestPartition(t)
	for i := range int64(n) {
		mustInsert(t, src, tabInts, intRow(i, "x"))
	}
	s, sh = activate(t, src, newTestPartition(t), cfg)
	sh.drain()
	return src, s, sh
}

// gatedUpdate asks the gate and, if it lets the txn through, updates the
// ints row in slot slot: one txn adding dirtyEntryBytes to the log.
func gatedUpdate(t *testing.T, s *Stream, src *partition.Partition, slot int) bool {
	t.Helper()
	if !s.BeforeTxn(txnid.ID(1)) {
		return false
	}
	if err := src.TableByName(tabInts).Update(partition.Slot(slot), intRow(int64(slot), "changed")); err != nil {
		t.Fatal(err)
	}
	return true
}

// The hold: no txn runs while the log is above ChangeLogBytesMax -
// ChangeLogTxnBytesMax, so a log of txns that add at most the reserve
// never passes ChangeLogBytesMax; shipping lifts the hold.
func TestHoldAtReserve(t *testing.T) {
	cfg := testConfig()
	cfg.ChangeLogBytesMax, cfg.ChangeLogTxnBytesMax, cfg.PaceLowWaterBytes = 40, 8, 0
	src, s, sh := behindSetup(t, 20, cfg)
	for i := range 9 { // 9 txns of 4 bytes: the last starts at 32, not above 32
		if !gatedUpdate(t, s, src, i) {
			t.Fatalf("txn %d held with %d log bytes", i, s.LogBytes())
		}
	}
	if gatedUpdate(t, s, src, 9) {
		t.Fatalf("txn ran with %d log bytes, above the hold mark 32", s.LogBytes())
	}
	if !s.Holding() || s.LogBytes() != 36 {
		t.Fatalf("holding %v with %d log bytes, want true, 36", s.Holding(), s.LogBytes())
	}
	if err := s.StartRound(); err != nil {
		t.Fatal(err)
	}
	sh.blocks(1) // one-row blocks: 4 bytes drained
	if !gatedUpdate(t, s, src, 9) {
		t.Fatalf("txn held with %d log bytes after a block shipped", s.LogBytes())
	}
	m := s.Metrics()
	if m.TxnsHeld != 1 || m.TxnsOverReserve != 0 || m.TxnBytesPeak != dirtyEntryBytes || m.LogBytesPeak != 36 {
		t.Fatalf("metrics %+v", m)
	}
	sh.finish(src)
}

// A txn that adds more than the reserve is let through, counted, and may
// take the log past its bound; the gate then holds until shipping drains.
func TestTxnOverReserve(t *testing.T) {
	cfg := testConfig()
	cfg.ChangeLogBytesMax, cfg.ChangeLogTxnBytesMax, cfg.PaceLowWaterBytes = 64, 16, 0
	src, s, sh := behindSetup(t, 30, cfg)
	if !s.BeforeTxn(1) {
		t.Fatal("first txn held")
	}
	tab := src.TableByName(tabInts)
	for i := range 20 { // one txn deleting 20 rows: 20 * (2 + 4) bytes
		if err := tab.Delete(partition.Slot(i)); err != nil {
			t.Fatal(err)
		}
	}
	if s.BeforeTxn(2) {
		t.Fatalf("txn ran with %d log bytes", s.LogBytes())
	}
	m := s.Metrics()
	if m.TxnsOverReserve != 1 || m.TxnBytesPeak != 120 || m.LogBytesPeak != 120 {
		t.Fatalf("metrics %+v, want one txn over the reserve, 120 bytes", m)
	}
	sh.round()
	if !s.BeforeTxn(3) {
		t.Fatal("txn held after the round")
	}
	sh.finish(src)
}

// Pacing starts at a tick when, over the window, the log grew by more
// than shipping drained and it is above the low-water mark; it allows
// PaceTxnsPerTick txns per tick; it stops once the log is at or below the
// mark. The sequence is worked out tick by tick in the comments.
func TestPacing(t *testing.T) {
	cfg := testConfig()
	cfg.ThrottleWindowTicks, cfg.PaceTxnsPerTick, cfg.PaceLowWaterBytes = 2, 2, 8
	src, s, sh := behindSetup(t, 40, cfg)
	slot := 0
	run := func(n int) (ran int) {
		for range n {
			if gatedUpdate(t, s, src, slot) {
				slot++
				ran++
			}
		}
		return ran
	}
	expect := func(step string, pacing bool, paced, throttled int64) {
		t.Helper()
		m := s.Metrics()
		if s.Pacing() != pacing || m.TxnsPaced != paced || m.ThrottledTicks != throttled {
			t.Fatalf("%s: pacing %v, %d paced, %d throttled ticks; want %v, %d, %d (log %d bytes)",
				step, s.Pacing(), m.TxnsPaced, m.ThrottledTicks, pacing, paced, throttled, s.LogBytes())
		}
	}
	run(5) // +20
	s.Tick()
	expect("tick 1: window +20 -0, log 20", true, 0, 1)
	if got := run(5); got != 2 {
		t.Fatalf("%d txns ran in a paced tick, want 2", got)
	}
	s.Tick()
	expect("tick 2: window +28 -0, log 28", true, 3, 2)
	sh.round() // -28
	if got := run(3); got != 3 {
		t.Fatalf("%d of 3 txns ran after the log drained", got)
	}
	expect("drained to 0, then +12", false, 3, 2)
	s.Tick()
	expect("tick 3: window +20 -28, log 12", false, 3, 2)
	run(3) // +12
	s.Tick()
	expect("tick 4: window +24 -28, log 24", false, 3, 2)
	run(3) // +12
	s.Tick()
	expect("tick 5: window +24 -0, log 36", true, 3, 3)
	if m := s.Metrics(); m.PaceStarts != 2 || m.Ticks != 5 {
		t.Fatalf("metrics %+v, want 2 pace starts, 5 ticks", m)
	}
	sh.finish(src)
}

// The log bound under load: heavy writes through the executor against a
// tiny log. Whenever the gate holds, the driver ships blocks instead; the
// log never passes ChangeLogBytesMax and the rejoin completes.
func TestLogBoundUnderHeavyWrites(t *testing.T) {
	cfg := Config{
		BlockBytesMax:        64,
		ChangeLogBytesMax:    128,
		ChangeLogTxnBytesMax: 16, // the most a txn below adds: a 2-byte key and a slot, 10 bytes
		PaceLowWaterBytes:    112,
		ThrottleWindowTicks:  1,
		PaceTxnsPerTick:      1 << 20,
	}
	src := newSource(t)
	g := gen{rng: rand.New(rand.NewPCG(7, 7))}
	for i := range int64(intKeys) {
		mustInsert(t, src.p, tabInts, intRow(i, g.value()))
	}
	dst := newTestPartition(t)
	s, sh := activate(t, src.p, dst, cfg)
	src.ex.SetGate(s)
	enc := wire.NewTupleEncoder()
	const txns = 3000
	executed, holds := 0, 0
	for step := 0; executed < txns; step++ {
		if step > 100*txns {
			t.Fatalf("stuck: %d txns executed, phase %v, log %d", executed, s.Phase(), s.LogBytes())
		}
		if src.ex.Queued() == 0 {
			key := wire.Int64(int64(g.rng.IntN(intKeys)))
			var proc string
			var vals []wire.Value
			switch g.rng.IntN(4) {
			case 0:
				proc, vals = partition.ProcDelete, []wire.Value{key}
			case 1:
				proc, vals = partition.ProcInsert, []wire.Value{key, wire.Bytes([]byte(g.value()))}
			case 2:
				proc, vals = procRekey, []wire.Value{key, wire.Int64(int64(g.rng.IntN(intKeys))), wire.Bytes([]byte(g.value()))}
			default:
				proc, vals = partition.ProcUpsert, []wire.Value{key, wire.Bytes([]byte(g.value()))}
			}
			params, err := enc.AppendTuple(nil, append([]wire.Value{wire.String(tabInts)}, vals...))
			if err != nil {
				t.Fatal(err)
			}
			src.offer(t, invocation{proc: proc, params: params})
		}
		_, ran := src.ex.Step()
		if ran {
			executed++
		} else {
			holds++
		}
		// Ship when held, and now and then anyway so that the cursor moves
		// and changes fall behind it.
		if !ran || step%4 == 0 {
			if !sh.next() && s.Phase() == PhaseBetweenRounds {
				if err := s.StartRound(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n := s.LogBytes(); n > cfg.ChangeLogBytesMax {
			t.Fatalf("step %d: log %d bytes, bound %d", step, n, cfg.ChangeLogBytesMax)
		}
		if step%16 == 0 {
			s.Tick()
		}
	}
	sh.finish(src.p)
	m := s.Metrics()
	t.Logf("%d txns, %d held asks, peak log %d of %d, %d rounds", txns, m.TxnsHeld, m.LogBytesPeak, cfg.ChangeLogBytesMax, m.Rounds)
	if m.TxnsHeld == 0 || holds == 0 || m.TxnsOverReserve != 0 || m.TxnBytesPeak > cfg.ChangeLogTxnBytesMax {
		t.Fatalf("the gate never held, or a txn passed the reserve: %+v", m)
	}
	if m.LogBytesPeak <= cfg.ChangeLogBytesMax-cfg.ChangeLogTxnBytesMax {
		t.Fatalf("the log peaked at %d, never above the hold mark: the bound was not tested", m.LogBytesPeak)
	}
}

// The round budget: while round k is in flight, a txn starts only while
// the log being filled is empty or holds less than half of what round k
// started with, so the next round is at most half of round k plus one
// txn's bytes.
// Shipping the round's blocks does not lift it; the round's end does.
func TestRoundBudget(t *testing.T) {
	src, s, sh := behindSetup(t, 40, testConfig())
	for i := range 10 { // 10 txns of 4 bytes: round 1 starts with 40
		if !gatedUpdate(t, s, src, i) {
			t.Fatalf("txn %d held between rounds with %d log bytes", i, s.LogBytes())
		}
	}
	if err := s.StartRound(); err != nil {
		t.Fatal(err)
	}
	sh.blocks(1)
	for i := 10; i < 15; i++ { // from 0 to 20 bytes: each starts below 20
		if !gatedUpdate(t, s, src, i) {
			t.Fatalf("txn %d held with %d bytes logged in a round of 40", i, s.cur.bytes)
		}
	}
	if gatedUpdate(t, s, src, 15) {
		t.Fatalf("txn ran with %d bytes logged in a round of 40, half used up", s.cur.bytes)
	}
	sh.blocks(3)
	if gatedUpdate(t, s, src, 15) {
		t.Fatal("txn ran before the round ended")
	}
	if !s.RoundBudgetSpent() {
		t.Fatal("RoundBudgetSpent false while the gate holds for the round")
	}
	s.Tick()
	sh.drain()
	if s.Phase() != PhaseBetweenRounds || s.RoundBudgetSpent() {
		t.Fatalf("phase %v, budget spent %v after the round shipped", s.Phase(), s.RoundBudgetSpent())
	}
	if !gatedUpdate(t, s, src, 15) {
		t.Fatal("txn held after the round ended")
	}
	m := s.Metrics()
	if m.TxnsHeldForRound != 2 || m.TxnsHeld != 0 || m.TxnsPaced != 0 || m.ThrottledTicks != 1 {
		t.Fatalf("metrics %+v, want 2 txns held for the round and 1 throttled tick", m)
	}
	sh.finish(src)
}

// Catch-up converges whatever the write rate: a writer that asks to run
// twenty times per block cut, against one-row blocks, with each round
// started as soon as the last is shipped (as recovery.Source does). Every
// round is at most half the one before plus one txn's bytes, so the rounds
// fall to a few txns' worth of log.
func TestRoundsConverge(t *testing.T) {
	const rows, asksPerBlock, roundsMax = 200, 20, 40
	src, s, sh := behindSetup(t, rows, testConfig())
	rng := rand.New(rand.NewPCG(9, 9))
	txnBytesMax := dirtyEntryBytes // an update of one slot
	for range 10 * asksPerBlock {  // what the writer did during the snapshot
		gatedUpdate(t, s, src, rng.IntN(rows))
	}
	var sizes []int
	for len(sizes) < roundsMax {
		for range asksPerBlock {
			gatedUpdate(t, s, src, rng.IntN(rows))
		}
		if sh.next() {
			continue
		}
		sizes = append(sizes, s.LogBytes())
		if err := s.StartRound(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("round sizes: %v", sizes)
	for k := 1; k < len(sizes); k++ {
		if 2*sizes[k] > sizes[k-1]+2*txnBytesMax {
			t.Fatalf("round %d started with %d bytes after a round of %d: want at most half plus %d", k+1, sizes[k], sizes[k-1], txnBytesMax)
		}
	}
	if last := sizes[len(sizes)-1]; last > 2*txnBytesMax {
		t.Fatalf("after %d rounds the round holds %d bytes, want at most %d", roundsMax, last, 2*txnBytesMax)
	}
	sh.finish(src)
}

// An empty log always lets one txn in, even during a round that started
// empty: a caller that starts round after round must not starve the
// executor (the log bound under heavy writes does that, with its rounds
// started back to back).
func TestEmptyRoundLetsOneTxnIn(t *testing.T) {
	src, s, sh := behindSetup(t, 4, testConfig())
	if err := s.StartRound(); err != nil { // an empty round
		t.Fatal(err)
	}
	if !gatedUpdate(t, s, src, 0) {
		t.Fatal("txn held with an empty log during an empty round")
	}
	if gatedUpdate(t, s, src, 1) {
		t.Fatalf("second txn ran with %d bytes logged during a round that started empty", s.cur.bytes)
	}
	sh.finish(src)
}
