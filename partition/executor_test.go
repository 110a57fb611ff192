package partition

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// workload makes, for a seed, the per-initiator streams of txns and
// heartbeats (an Invocation without Proc) that every replica receives: increasing IDs from generators on
// a shared clock that stalls and steps back, builtin procedures on a small
// key space so that some fail (duplicate keys, missing rows, overdrafts).
func workload(t testing.TB, seed uint64, initiators, perInitiator int) [][]Invocation {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	now := txnid.EpochUnixMillis + 1000
	clock := func() int64 { return now }
	streams := make([][]Invocation, initiators)
	gens := make([]*txnid.Generator, initiators)
	for i := range gens {
		g, err := txnid.NewGenerator(txnid.Initiator(i+1), clock)
		if err != nil {
			t.Fatal(err)
		}
		gens[i] = g
	}
	enc := wire.NewTupleEncoder()
	for n := 0; n < initiators*perInitiator; n++ {
		now += int64(rng.IntN(3)) - 1 // stalls and steps back too
		i := rng.IntN(initiators)
		id := gens[i].Next()
		if rng.IntN(5) == 0 {
			streams[i] = append(streams[i], Invocation{ID: id})
			continue
		}
		acc := wire.String("accounts")
		k1 := []wire.Value{wire.String("eu"), wire.Int64(int64(rng.IntN(8)))}
		k2 := []wire.Value{wire.String("eu"), wire.Int64(int64(rng.IntN(8)))}
		var proc string
		var vals []wire.Value
		switch rng.IntN(5) {
		case 0:
			proc, vals = ProcInsert, withTable("accounts", account("eu", k1[1].Int, rng.Int64N(50), "n"))
		case 1:
			proc, vals = ProcUpsert, withTable("accounts", account("eu", k1[1].Int, rng.Int64N(50), "u"))
		case 2:
			proc, vals = ProcDelete, append([]wire.Value{acc}, k1...)
		case 3:
			proc, vals = ProcIncrement, append([]wire.Value{acc, wire.String("balance"), wire.Int64(rng.Int64N(20) - 10)}, k1...)
		default:
			vals = append([]wire.Value{acc, wire.String("balance"), wire.Int64(1 + rng.Int64N(30))}, k1...)
			proc, vals = ProcTransfer, append(vals, k2...)
		}
		params, err := enc.AppendTuple(nil, vals)
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = append(streams[i], Invocation{ID: id, Proc: proc, Params: params})
	}
	// A final heartbeat from everyone, later than every txn sent, lets every
	// txn become safe.
	now += 1000
	for i := range streams {
		streams[i] = append(streams[i], Invocation{ID: gens[i].Next()})
	}
	return streams
}

// outcome is what one replica did: the results in order and the digest.
type outcome struct {
	results []string
	digest  uint64
	content string
}

// replay delivers the streams to a fresh replica, interleaving them with a
// delivery order drawn from order, stepping at random moments, and checks
// the executor's ordering rules as it goes.
func replay(t *testing.T, streams [][]Invocation, order uint64) outcome {
	t.Helper()
	p, _ := newAccounts(t)
	e := NewExecutor(p, NewBuiltinRegistry(), ExecutorConfig{})
	for i := range streams {
		e.AddInitiator(txnid.Initiator(i + 1))
	}
	rng := rand.New(rand.NewPCG(order, 2))
	next := make([]int, len(streams))
	var out outcome
	var prev txnid.ID
	step := func() bool {
		safe, _ := e.Safe()
		res, ok := e.Step()
		if !ok {
			return false
		}
		if res.ID <= prev {
			t.Fatalf("executed %v after %v", res.ID, prev)
		}
		if res.ID > safe {
			t.Fatalf("executed %v above the safe txn ID %v", res.ID, safe)
		}
		prev = res.ID
		out.results = append(out.results, fmt.Sprintf("%v %x %v", res.ID, res.Out, res.Err))
		return true
	}
	for {
		var open []int
		for i := range streams {
			if next[i] < len(streams[i]) {
				open = append(open, i)
			}
		}
		if len(open) == 0 {
			break
		}
		i := open[rng.IntN(len(open))]
		m := streams[i][next[i]]
		next[i]++
		var err error
		if m.Proc == "" {
			err = e.Heartbeat(m.ID)
		} else {
			err = e.Offer(m)
		}
		if err != nil {
			t.Fatalf("delivery of %v: %v", m.ID, err)
		}
		for rng.IntN(2) == 0 && step() {
		}
	}
	for step() {
	}
	if e.Queued() != 0 {
		t.Fatalf("%d txns left queued after every initiator's last heartbeat", e.Queued())
	}
	out.digest = p.Digest()
	out.content = snapshotRows(p)
	return out
}

// snapshotRows lists the rows without their slot numbers, which are local
// to a replica: replicas are equal when their rows are. Compared beside the
// digest so that a digest bug cannot hide a content difference.
func snapshotRows(p *Partition) string {
	rows := map[string]bool{}
	for _, t := range p.Tables() {
		for s := Slot(0); s < t.SlotsLen(); s++ {
			if tu := t.Tuple(s); tu != nil {
				rows[fmt.Sprintf("%d:%x", t.ID(), tu)] = true
			}
		}
	}
	return fmt.Sprint(rows) // fmt sorts map keys
}

// TestExecutorDeterministicAcrossDeliveryOrders is the replica property:
// the same streams delivered in different interleavings produce the same
// results in the same order and the same content.
func TestExecutorDeterministicAcrossDeliveryOrders(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		streams := workload(t, seed, 1+int(seed%4), 60)
		want := replay(t, streams, 1000)
		if len(want.results) == 0 {
			t.Fatalf("seed %d: nothing executed", seed)
		}
		errs := 0
		for _, r := range want.results {
			if r[len(r)-5:] != "<nil>" {
				errs++
			}
		}
		if errs == 0 || errs == len(want.results) {
			t.Fatalf("seed %d: %d of %d txns failed; the workload should mix both", seed, errs, len(want.results))
		}
		for order := uint64(1); order <= 5; order++ {
			got := replay(t, streams, order)
			if fmt.Sprint(got.results) != fmt.Sprint(want.results) {
				t.Fatalf("seed %d order %d: results differ\n got %v\nwant %v", seed, order, got.results, want.results)
			}
			if got.digest != want.digest || got.content != want.content {
				t.Fatalf("seed %d order %d: content differs (digest %x vs %x)", seed, order, got.digest, want.digest)
			}
		}
	}
}

func mkID(ms int64, in txnid.Initiator) txnid.ID { return txnid.Make(ms, 0, in) }

func insertInv(t testing.TB, id txnid.ID, key int64) Invocation {
	return Invocation{ID: id, Proc: ProcInsert, Params: tuple(t, withTable("accounts", account("eu", key, 0, ""))...)}
}

func TestExecutorWaitsForSafe(t *testing.T) {
	p, tbl := newAccounts(t)
	e := NewExecutor(p, NewBuiltinRegistry(), ExecutorConfig{})
	e.AddInitiator(1)
	e.AddInitiator(2)
	if err := e.Offer(insertInv(t, mkID(10, 1), 1)); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Step(); ok {
		t.Fatal("ran a txn before initiator 2 said anything")
	}
	if err := e.Heartbeat(mkID(9, 2)); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Step(); ok {
		t.Fatal("ran txn 10 with the safe txn ID at 9")
	}
	if err := e.Heartbeat(mkID(10, 2)); err != nil {
		t.Fatal(err)
	}
	res, ok := e.Step()
	if !ok || res.Err != nil || res.ID != mkID(10, 1) {
		t.Fatalf("Step = %v, %v; want txn %v run", res, ok, mkID(10, 1))
	}
	if tbl.Len() != 1 || e.LastExecuted() != mkID(10, 1) {
		t.Fatalf("len %d, last %v", tbl.Len(), e.LastExecuted())
	}
	// Removing the silent initiator releases what waits on it.
	if err := e.Offer(insertInv(t, mkID(20, 1), 2)); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Step(); ok {
		t.Fatal("ran txn 20 with the safe txn ID at 10")
	}
	e.RemoveInitiator(2)
	if _, ok := e.Step(); !ok {
		t.Fatal("txn 20 did not run after the silent initiator was removed")
	}
}

func TestExecutorRejectsWithoutChange(t *testing.T) {
	p, _ := newAccounts(t)
	e := NewExecutor(p, NewBuiltinRegistry(), ExecutorConfig{QueueTxnsMax: 2})
	e.AddInitiator(1)
	e.AddInitiator(2)
	if err := e.Offer(insertInv(t, mkID(10, 1), 1)); err != nil {
		t.Fatal(err)
	}
	check := func(name string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: err %v, want %v", name, err, want)
		}
		if e.Queued() != 1 {
			t.Errorf("%s: queue has %d, want 1", name, e.Queued())
		}
	}
	check("duplicate", e.Offer(insertInv(t, mkID(10, 1), 1)), txnid.ErrNotIncreasing)
	check("out of order", e.Offer(insertInv(t, mkID(9, 1), 1)), txnid.ErrNotIncreasing)
	check("heartbeat behind", e.Heartbeat(mkID(5, 1)), txnid.ErrNotIncreasing)
	check("unknown initiator", e.Offer(insertInv(t, mkID(11, 3), 1)), txnid.ErrUnknownInitiator)
	if err := e.Offer(insertInv(t, mkID(11, 2), 2)); err != nil {
		t.Fatal(err)
	}
	if err := e.Offer(insertInv(t, mkID(12, 1), 3)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third offer with QueueTxnsMax 2: %v, want ErrQueueFull", err)
	}
	if err := e.Heartbeat(mkID(12, 1)); err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok := e.Step(); !ok {
			break
		}
	}
	if e.LastExecuted() != mkID(11, 2) {
		t.Fatalf("last executed %v, want %v", e.LastExecuted(), mkID(11, 2))
	}
	// A newly added initiator cannot slip a txn in below what already ran.
	e.AddInitiator(4)
	if err := e.Offer(insertInv(t, mkID(11, 0)+0, 9)); !errors.Is(err, ErrTooLate) {
		t.Fatalf("offer below last executed: %v, want ErrTooLate", err)
	}
	if err := e.Offer(insertInv(t, mkID(5, 4), 9)); !errors.Is(err, ErrTooLate) {
		t.Fatalf("offer from a new initiator below last executed: %v, want ErrTooLate", err)
	}
}

// holdAt is a gate that holds execution at one txn ID until released, and
// records what it was asked.
type holdAt struct {
	at    txnid.ID
	held  bool
	asked []txnid.ID
}

func (g *holdAt) BeforeTxn(next txnid.ID) bool {
	g.asked = append(g.asked, next)
	return !(g.held && next >= g.at)
}

func TestExecutorGateHoldsAtBoundary(t *testing.T) {
	p, tbl := newAccounts(t)
	e := NewExecutor(p, NewBuiltinRegistry(), ExecutorConfig{})
	e.AddInitiator(1)
	gate := &holdAt{at: mkID(20, 1), held: true}
	e.SetGate(gate)
	for i, ms := range []int64{10, 20, 30} {
		if err := e.Offer(insertInv(t, mkID(ms, 1), int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	ran := 0
	for {
		if _, ok := e.Step(); !ok {
			break
		}
		ran++
	}
	if ran != 1 || e.LastExecuted() != mkID(10, 1) || tbl.Len() != 1 {
		t.Fatalf("ran %d, last %v, len %d; want exactly txn 10 before the gate", ran, e.LastExecuted(), tbl.Len())
	}
	if got := gate.asked[len(gate.asked)-1]; got != mkID(20, 1) {
		t.Fatalf("gate last asked about %v, want %v", got, mkID(20, 1))
	}
	gate.held = false
	for {
		if _, ok := e.Step(); !ok {
			break
		}
	}
	if e.LastExecuted() != mkID(30, 1) || tbl.Len() != 3 {
		t.Fatalf("after release: last %v, len %d", e.LastExecuted(), tbl.Len())
	}
}

func TestExecutorQueuedFromAndResetTo(t *testing.T) {
	p, tbl := newAccounts(t)
	e := NewExecutor(p, NewBuiltinRegistry(), ExecutorConfig{})
	e.AddInitiator(1)
	e.AddInitiator(2)
	for i, id := range []txnid.ID{mkID(10, 1), mkID(20, 2), mkID(30, 1), mkID(40, 2)} {
		if err := e.Offer(insertInv(t, id, int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		p    txnid.ID
		want txnid.ID
		ok   bool
	}{
		{mkID(0, 0), mkID(10, 1), true},
		{mkID(15, 0), mkID(20, 2), true},
		{mkID(30, 1), mkID(30, 1), true},
		{mkID(41, 0), 0, false},
	} {
		got, ok := e.QueuedFrom(tt.p)
		if got != tt.want || ok != tt.ok {
			t.Errorf("QueuedFrom(%v) = %v, %v; want %v, %v", tt.p, got, ok, tt.want, tt.ok)
		}
	}
	if n := e.ResetTo(mkID(30, 1)); n != 2 {
		t.Fatalf("ResetTo dropped %d, want 2", n)
	}
	if err := e.Offer(insertInv(t, mkID(25, 1), 9)); !errors.Is(err, ErrTooLate) {
		t.Fatalf("offer below the handoff point: %v, want ErrTooLate", err)
	}
	if err := e.Heartbeat(mkID(50, 1)); err != nil {
		t.Fatal(err)
	}
	if err := e.Heartbeat(mkID(50, 2)); err != nil {
		t.Fatal(err)
	}
	var ran []txnid.ID
	for {
		res, ok := e.Step()
		if !ok {
			break
		}
		ran = append(ran, res.ID)
	}
	if fmt.Sprint(ran) != fmt.Sprint([]txnid.ID{mkID(30, 1), mkID(40, 2)}) || tbl.Len() != 2 {
		t.Fatalf("ran %v (len %d); want txns 30 and 40", ran, tbl.Len())
	}
}

// TestExecutorInitiators: the initiators whose txns may still run are
// those tracked and those with a txn queued, in order.
func TestExecutorInitiators(t *testing.T) {
	e := NewExecutor(New(), NewBuiltinRegistry(), ExecutorConfig{})
	for _, in := range []txnid.Initiator{5, 2, 9} {
		e.AddInitiator(in)
	}
	if err := e.Offer(Invocation{ID: txnid.Make(10, 0, 9), Proc: "noop"}); err != nil {
		t.Fatal(err)
	}
	e.RemoveInitiator(9) // its txn stays queued
	e.RemoveInitiator(5)
	if got := e.Initiators(); !slices.Equal(got, []txnid.Initiator{2, 9}) {
		t.Fatalf("Initiators = %v, want [2 9]", got)
	}
}
