package txnid

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestTrackerEmpty(t *testing.T) {
	tr := NewTracker()
	if id, ok := tr.Safe(); ok || id != Zero {
		t.Fatalf("empty tracker: Safe = %s, %v; want Zero, false", id, ok)
	}
	if _, ok := tr.Last(3); ok {
		t.Fatal("empty tracker knows initiator 3")
	}
	if err := tr.Observe(3, Make(1, 0, 3)); !errors.Is(err, ErrUnknownInitiator) {
		t.Fatalf("Observe on unknown initiator: err = %v, want ErrUnknownInitiator", err)
	}
	tr.Remove(3) // Unknown: nothing to do.
	if tr.Len() != 0 {
		t.Fatalf("Len = %d, want 0", tr.Len())
	}
}

func TestTrackerSafe(t *testing.T) {
	tr := NewTracker()
	mustObserve := func(in Initiator, id ID) {
		t.Helper()
		if err := tr.Observe(in, id); err != nil {
			t.Fatal(err)
		}
	}
	wantSafe := func(want ID) {
		t.Helper()
		if got, ok := tr.Safe(); !ok || got != want {
			t.Fatalf("Safe = %s, %v; want %s, true", got, ok, want)
		}
		if err := tr.checkInvariants(); err != nil {
			t.Fatal(err)
		}
	}

	tr.Add(1)
	wantSafe(Zero) // Silent initiator holds the safe point.
	mustObserve(1, Make(10, 0, 1))
	wantSafe(Make(10, 0, 1))

	tr.Add(2)
	wantSafe(Zero) // Adding one can move Safe down until it speaks.
	mustObserve(2, Make(5, 0, 2))
	wantSafe(Make(5, 0, 2))
	mustObserve(2, Make(20, 0, 2)) // A heartbeat past initiator 1.
	wantSafe(Make(10, 0, 1))

	tr.Add(2) // Already tracked: keeps its history.
	if last, ok := tr.Last(2); !ok || last != Make(20, 0, 2) {
		t.Fatalf("re-Add reset initiator 2: Last = %s, %v", last, ok)
	}
	wantSafe(Make(10, 0, 1))

	tr.Remove(1) // The slowest leaves: Safe moves up.
	wantSafe(Make(20, 0, 2))

	tr.Add(1) // Back with no history.
	if last, ok := tr.Last(1); !ok || last != Zero {
		t.Fatalf("re-added initiator 1: Last = %s, %v; want Zero, true", last, ok)
	}
	wantSafe(Zero)
}

func TestTrackerObserveRejects(t *testing.T) {
	const in = 4
	for _, tc := range []struct {
		name  string
		prior []ID // Accepted from in first.
		from  Initiator
		id    ID
		want  error
	}{
		{"zero before anything", nil, in, Zero, ErrNotIncreasing},
		{"duplicate", []ID{Make(7, 1, in)}, in, Make(7, 1, in), ErrNotIncreasing},
		{"decreasing counter", []ID{Make(7, 1, in)}, in, Make(7, 0, in), ErrNotIncreasing},
		{"decreasing millis", []ID{Make(7, 1, in)}, in, Make(6, 9, in), ErrNotIncreasing},
		{"older than the last of several", []ID{Make(1, 0, in), Make(9, 0, in)}, in, Make(5, 0, in), ErrNotIncreasing},
		{"unknown initiator", nil, in + 1, Make(1, 0, in+1), ErrUnknownInitiator},
		{"increasing", []ID{Make(7, 1, in)}, in, Make(7, 2, in), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker()
			tr.Add(in)
			for _, id := range tc.prior {
				if err := tr.Observe(in, id); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := tr.Last(in)
			err := tr.Observe(tc.from, tc.id)
			if !errors.Is(err, tc.want) { // errors.Is(err, nil) means err == nil.
				t.Fatalf("Observe(%s) = %v, want %v", tc.id, err, tc.want)
			}
			if err != nil {
				// A rejected ID leaves the tracker as it was.
				if after, _ := tr.Last(in); after != before {
					t.Fatalf("rejected Observe moved Last from %s to %s", before, after)
				}
			}
		})
	}
}

// trackerModel is the brute-force reference: a map and a linear minimum.
type trackerModel map[Initiator]ID

func (m trackerModel) safe() (ID, bool) {
	if len(m) == 0 {
		return Zero, false
	}
	low := Max
	for _, last := range m {
		low = min(low, last)
	}
	return low, true
}

// trackerOp applies one operation (op picks which) to both the tracker and
// the model, and compares them. It is shared by the seeded property test
// and the fuzz test.
func trackerOp(tr *Tracker, m trackerModel, op byte, in Initiator, id ID) error {
	switch op % 4 {
	case 0:
		tr.Add(in)
		if _, ok := m[in]; !ok {
			m[in] = Zero
		}
	case 1:
		tr.Remove(in)
		delete(m, in)
	default: // Observe twice as often as the others, or Safe rarely moves.
		err := tr.Observe(in, id)
		last, known := m[in]
		switch {
		case !known:
			if !errors.Is(err, ErrUnknownInitiator) {
				return fmt.Errorf("Observe(%d, %s) on unknown initiator: err = %v", in, id, err)
			}
		case id <= last:
			if !errors.Is(err, ErrNotIncreasing) {
				return fmt.Errorf("Observe(%d, %s) after %s: err = %v", in, id, last, err)
			}
		default:
			if err != nil {
				return fmt.Errorf("Observe(%d, %s) after %s: %v", in, id, last, err)
			}
			m[in] = id
		}
	}
	gotID, gotOK := tr.Safe()
	wantID, wantOK := m.safe()
	if gotID != wantID || gotOK != wantOK {
		return fmt.Errorf("Safe = %s, %v; brute force says %s, %v", gotID, gotOK, wantID, wantOK)
	}
	last, ok := tr.Last(in)
	if wantLast, wantOK := m[in]; last != wantLast || ok != wantOK {
		return fmt.Errorf("Last(%d) = %s, %v; want %s, %v", in, last, ok, wantLast, wantOK)
	}
	if tr.Len() != len(m) {
		return fmt.Errorf("Len = %d, want %d", tr.Len(), len(m))
	}
	return tr.checkInvariants()
}

func TestTrackerMatchesBruteForce(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 0x5afe))
		tr, m := NewTracker(), trackerModel{}
		// Few initiators and a narrow ID range, so that duplicates, stale
		// IDs and ties between initiators all come up.
		initiators := 1 + rng.IntN(12)
		for i := range 5_000 {
			op := byte(rng.IntN(4))
			in := Initiator(rng.IntN(initiators))
			id := ID(rng.Uint64N(1 << 16))
			if err := trackerOp(tr, m, op, in, id); err != nil {
				t.Fatalf("seed %d op %d: %v", seed, i, err)
			}
		}
	}
}

// The tracker fed by real generators: every ID is accepted in order, and the
// safe point never passes anything a slower initiator can still send.
func TestTrackerWithGenerators(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	c := &fakeClock{now: EpochUnixMillis}
	gens := make([]*Generator, 4)
	tr := NewTracker()
	for i := range gens {
		gens[i] = newTestGenerator(t, Initiator(i), c)
		tr.Add(Initiator(i))
	}
	for i := range 10_000 {
		c.now += rng.Int64N(2)
		g := gens[rng.IntN(len(gens))]
		id := g.Next()
		if safe, _ := tr.Safe(); id <= safe {
			t.Fatalf("call %d: %s arrived at or below the safe point %s", i, id, safe)
		}
		if err := tr.Observe(g.Initiator(), id); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

func FuzzTracker(f *testing.F) {
	f.Add([]byte{0, 1, 2, 1, 9, 3, 1, 9, 1, 1})
	f.Add([]byte{0, 0, 0, 0, 1, 0, 2, 0, 5, 2, 0, 5, 2, 0, 4})
	f.Fuzz(func(t *testing.T, script []byte) {
		// Each op is three bytes: operation, initiator, id. Eight
		// initiators and 256 ids keep collisions frequent.
		tr, m := NewTracker(), trackerModel{}
		for i := 0; i+3 <= len(script); i += 3 {
			op, in, id := script[i], Initiator(script[i+1]%8), ID(script[i+2])
			if err := trackerOp(tr, m, op, in, id); err != nil {
				t.Fatalf("op %d: %v", i/3, err)
			}
		}
	})
}

func BenchmarkTrackerObserve(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("initiators=%d", n), func(b *testing.B) {
			tr := NewTracker()
			gens := make([]*Generator, n)
			var now int64 = EpochUnixMillis
			clock := func() int64 { return now }
			for i := range gens {
				g, err := NewGenerator(Initiator(i), clock)
				if err != nil {
					b.Fatal(err)
				}
				gens[i] = g
				tr.Add(Initiator(i))
			}
			i := 0
			for b.Loop() {
				// Round robin keeps the observed initiator the slowest one,
				// the case that moves the heap the most.
				g := gens[i%n]
				i++
				if i%1024 == 0 {
					now++
				}
				if err := tr.Observe(g.Initiator(), g.Next()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestTrackerInitiators(t *testing.T) {
	tr := NewTracker()
	for _, in := range []Initiator{7, 3, 5} {
		tr.Add(in)
	}
	tr.Remove(5)
	got := tr.Initiators()
	if len(got) != 2 || got[0] != 3 || got[1] != 7 {
		t.Fatalf("Initiators = %v, want [3 7]", got)
	}
}

// TestTrackerAddAbove: an initiator added above a floor holds Safe() at
// the floor, not at Zero, and an ID of it at or below the floor is refused.
func TestTrackerAddAbove(t *testing.T) {
	tr := NewTracker()
	tr.Add(1)
	if err := tr.Observe(1, Make(500, 0, 1)); err != nil {
		t.Fatal(err)
	}
	floor := Make(400, 0, 1)
	tr.AddAbove(2, floor)
	if safe, ok := tr.Safe(); !ok || safe != floor {
		t.Fatalf("Safe() = %v, %v; want the floor %v", safe, ok, floor)
	}
	if err := tr.Observe(2, Make(399, 0, 2)); err == nil {
		t.Fatal("an ID below the floor was accepted")
	}
	if err := tr.Observe(2, floor); err == nil {
		t.Fatal("an ID at the floor was accepted")
	}
	if err := tr.Observe(2, Make(600, 0, 2)); err != nil {
		t.Fatal(err)
	}
	if safe, _ := tr.Safe(); safe != Make(500, 0, 1) {
		t.Fatalf("Safe() = %v; want %v", safe, Make(500, 0, 1))
	}
	tr.AddAbove(2, Make(900, 0, 1)) // already tracked: nothing changes
	if last, _ := tr.Last(2); last != Make(600, 0, 2) {
		t.Fatalf("a second AddAbove moved Last to %v", last)
	}
}
