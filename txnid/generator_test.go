package txnid

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// fakeClock returns whatever its test sets.
type fakeClock struct{ now int64 }

func (c *fakeClock) read() int64 { return c.now }

func newTestGenerator(t testing.TB, in Initiator, c *fakeClock) *Generator {
	t.Helper()
	g, err := NewGenerator(in, c.read)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestNewGeneratorRejects(t *testing.T) {
	clock := func() int64 { return EpochUnixMillis }
	if _, err := NewGenerator(InitiatorsMax, clock); !errors.Is(err, ErrInitiatorRange) {
		t.Fatalf("initiator %d: err = %v, want ErrInitiatorRange", InitiatorsMax, err)
	}
	if _, err := NewGenerator(math.MaxUint16, clock); !errors.Is(err, ErrInitiatorRange) {
		t.Fatalf("initiator %d: err = %v, want ErrInitiatorRange", math.MaxUint16, err)
	}
	if _, err := NewGenerator(0, nil); err == nil {
		t.Fatal("nil clock accepted")
	}
	g, err := NewGenerator(InitiatorsMax-1, clock)
	if err != nil {
		t.Fatalf("initiator %d: %v", InitiatorsMax-1, err)
	}
	if g.Last() != Zero || g.Initiator() != InitiatorsMax-1 {
		t.Fatalf("fresh generator: Last = %s, Initiator = %d", g.Last(), g.Initiator())
	}
}

func TestGeneratorSteps(t *testing.T) {
	const in = 5
	c := &fakeClock{now: EpochUnixMillis}
	g := newTestGenerator(t, in, c)
	for _, step := range []struct {
		name  string
		clock int64 // Unix ms.
		want  ID
	}{
		// The (0, 0) slot is never issued, so the first ID is above Zero
		// even for initiator 0 at the epoch.
		{"at epoch", EpochUnixMillis, Make(0, 1, in)},
		{"clock moves", EpochUnixMillis + 10, Make(10, 0, in)},
		{"clock stalls", EpochUnixMillis + 10, Make(10, 1, in)},
		{"clock steps back", EpochUnixMillis + 3, Make(10, 2, in)},
		{"before epoch", EpochUnixMillis - 1, Make(10, 3, in)},
		{"past MillisMax", EpochUnixMillis + MillisMax + 1, Make(10, 4, in)},
		{"far past", math.MinInt64, Make(10, 5, in)},
		{"far future", math.MaxInt64, Make(10, 6, in)},
		{"clock catches up", EpochUnixMillis + 11, Make(11, 0, in)},
	} {
		c.now = step.clock
		if got := g.Next(); got != step.want {
			t.Fatalf("%s: Next = %s, want %s", step.name, got, step.want)
		}
		if g.Last() != step.want {
			t.Fatalf("%s: Last = %s, want %s", step.name, g.Last(), step.want)
		}
	}
}

func TestGeneratorCounterOverflowRunsAhead(t *testing.T) {
	const in = 1
	c := &fakeClock{now: EpochUnixMillis + 100}
	g := newTestGenerator(t, in, c)
	for i := range IDsPerMillisMax {
		if got, want := g.Next(), Make(100, uint32(i), in); got != want {
			t.Fatalf("call %d: Next = %s, want %s", i, got, want)
		}
	}
	// The millisecond is full: logical time runs one ms ahead of the clock.
	if got, want := g.Next(), Make(101, 0, in); got != want {
		t.Fatalf("after overflow: Next = %s, want %s", got, want)
	}
	// The clock reaching logical time is still a stall...
	c.now = EpochUnixMillis + 101
	if got, want := g.Next(), Make(101, 1, in); got != want {
		t.Fatalf("clock at logical time: Next = %s, want %s", got, want)
	}
	// ...and passing it hands control back to the clock.
	c.now = EpochUnixMillis + 102
	if got, want := g.Next(), Make(102, 0, in); got != want {
		t.Fatalf("clock past logical time: Next = %s, want %s", got, want)
	}
}

func TestGeneratorExhaustionPanics(t *testing.T) {
	c := &fakeClock{now: EpochUnixMillis + MillisMax}
	g := newTestGenerator(t, 0, c)
	for range IDsPerMillisMax {
		g.Next()
	}
	if g.Last() != Make(MillisMax, IDsPerMillisMax-1, 0) {
		t.Fatalf("Last = %s, want the last ID of initiator 0", g.Last())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Next past the end of the ID space did not panic")
		}
	}()
	g.Next()
}

// adversarialClock wanders around a wall time that mostly advances, and
// reads it back with stalls, steps back, leaps forward and readings the
// layout cannot hold. Now and then it freezes for long enough to fill a
// millisecond's counter.
type adversarialClock struct {
	rng    *rand.Rand
	wall   int64 // Unix ms; only plausible readings move it.
	frozen int   // Reads left before the clock moves again.
}

func (c *adversarialClock) read() int64 {
	if c.frozen > 0 {
		c.frozen--
		return c.wall
	}
	var now int64
	switch p := c.rng.IntN(100); {
	case p < 1:
		c.frozen = c.rng.IntN(3 * IDsPerMillisMax)
		return c.wall
	case p < 40:
		now = c.wall + c.rng.Int64N(3)
	case p < 60:
		now = c.wall // Stall.
	case p < 80:
		now = c.wall - c.rng.Int64N(1000) // Step back, possibly before the epoch.
	case p < 95:
		now = c.wall + c.rng.Int64N(100_000) // Leap.
	case p < 97:
		return EpochUnixMillis - 1 - c.rng.Int64N(1<<40)
	default:
		return EpochUnixMillis + MillisMax + 1 + c.rng.Int64N(1<<40)
	}
	c.wall = now
	return now
}

func TestGeneratorStrictlyIncreasingUnderAdversarialClock(t *testing.T) {
	overflows := 0 // Logical time pushed ahead of the clock by a full counter.
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 0x7a11))
		in := Initiator(rng.UintN(InitiatorsMax))
		walk := &adversarialClock{rng: rng, wall: EpochUnixMillis + rng.Int64N(1000)}
		c := &fakeClock{}
		g := newTestGenerator(t, in, c)
		prev := Zero
		for i := range 50_000 {
			c.now = walk.read()
			id := g.Next()
			if id <= prev {
				t.Fatalf("seed %d call %d: clock %d gave %s after %s", seed, i, c.now, id, prev)
			}
			if id.Initiator() != in {
				t.Fatalf("seed %d call %d: %s carries initiator %d, want %d", seed, i, id, id.Initiator(), in)
			}
			// Logical time never lags a representable clock reading.
			if c.now >= EpochUnixMillis && c.now-EpochUnixMillis <= MillisMax && id.UnixMillis() < c.now {
				t.Fatalf("seed %d call %d: %s behind clock %d", seed, i, id, c.now)
			}
			if id.Counter() == 0 && id.Millis() == prev.Millis()+1 && id.UnixMillis() > c.now {
				overflows++
			}
			prev = id
		}
	}
	if overflows == 0 {
		t.Fatal("no counter overflow exercised; the clock walk no longer covers it")
	}
}

// Two initiators on one clock, as when the simulator runs a cluster on one
// time source, must never issue the same ID.
func TestGeneratorsOnSameClockNeverCollide(t *testing.T) {
	for seed := range uint64(10) {
		rng := rand.New(rand.NewPCG(seed, 0xc011))
		walk := &adversarialClock{rng: rng, wall: EpochUnixMillis}
		c := &fakeClock{}
		a := newTestGenerator(t, 0, c)
		b := newTestGenerator(t, 1, c)
		seen := make(map[ID]Initiator)
		for i := range 20_000 {
			c.now = walk.read()
			g := a
			if rng.IntN(2) == 1 {
				g = b
			}
			id := g.Next()
			if other, dup := seen[id]; dup {
				t.Fatalf("seed %d call %d: %s issued by %d and %d", seed, i, id, other, g.Initiator())
			}
			seen[id] = g.Initiator()
		}
	}
}

func BenchmarkGeneratorNext(b *testing.B) {
	// A clock that ticks every 1000 reads, roughly a busy initiator.
	var reads int64
	clock := func() int64 {
		reads++
		return EpochUnixMillis + reads/1000
	}
	g, err := NewGenerator(1, clock)
	if err != nil {
		b.Fatal(err)
	}
	var last ID
	for b.Loop() {
		last = g.Next()
	}
	if last == Zero {
		b.Fatal("no IDs issued")
	}
}

// TestGeneratorAdvance: after Advance(floor) every ID is above floor,
// whichever initiator issued floor and however far behind the clock is;
// a floor below the logical time changes nothing; and the IDs still rise.
func TestGeneratorAdvance(t *testing.T) {
	now := EpochUnixMillis + 1000
	g, err := NewGenerator(3, func() int64 { return now })
	if err != nil {
		t.Fatal(err)
	}
	first := g.Next()
	for _, floor := range []ID{
		Make(1500, 7, 9),                 // ahead of the clock, a higher initiator id
		Make(1500, 7, 1),                 // same slot, a lower one: changes nothing more
		Make(1200, 0, 9),                 // below the logical time: changes nothing
		Make(1500, IDsPerMillisMax-1, 9), // the millisecond's last counter
	} {
		before := g.Last()
		g.Advance(floor)
		id := g.Next()
		if id <= floor || id <= before {
			t.Fatalf("after Advance(%v) from %v: Next %v", floor, before, id)
		}
	}
	if g.Last() <= first {
		t.Fatalf("ids fell from %v to %v", first, g.Last())
	}
	now = EpochUnixMillis + 2000 // the clock passes the logical time again
	if id := g.Next(); id.Millis() != 2000 {
		t.Fatalf("logical time %d ms, want the clock's 2000 ms past the epoch", id.Millis())
	}
}
