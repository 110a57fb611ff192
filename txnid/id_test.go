package txnid

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestLayoutFillsUint64(t *testing.T) {
	if got := MillisBits + CounterBits + InitiatorBits; got != 64 {
		t.Fatalf("field widths add up to %d bits, want 64", got)
	}
	if Max != Make(MillisMax, IDsPerMillisMax-1, InitiatorsMax-1) {
		t.Fatalf("Max = %#x is not the all-fields-full ID", uint64(Max))
	}
}

func TestEpochAndRange(t *testing.T) {
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if EpochUnixMillis != epoch.UnixMilli() {
		t.Fatalf("EpochUnixMillis = %d, want %d (%s)", EpochUnixMillis, epoch.UnixMilli(), epoch)
	}
	// The end date is quoted in doc.go and beside MillisMax.
	end := time.UnixMilli(Max.UnixMillis()).UTC()
	want := time.Date(2165, 5, 15, 7, 35, 11, 103e6, time.UTC)
	if !end.Equal(want) {
		t.Fatalf("last representable time = %s, want %s", end, want)
	}
}

func TestMakeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ms      int64
		counter uint32
		in      Initiator
		str     string
	}{
		{"zero", 0, 0, 0, "t0.c0.i0"},
		{"initiator only", 0, 0, 7, "t0.c0.i7"},
		{"counter only", 0, 3, 0, "t0.c3.i0"},
		{"typical", 1234567, 3, 2, "t1234567.c3.i2"},
		{"max initiator", 1, 1, InitiatorsMax - 1, "t1.c1.i1023"},
		{"max counter", 1, IDsPerMillisMax - 1, 1, "t1.c4095.i1"},
		{"max millis", MillisMax, 0, 0, "t4398046511103.c0.i0"},
		{"max", MillisMax, IDsPerMillisMax - 1, InitiatorsMax - 1, "t4398046511103.c4095.i1023"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := Make(tc.ms, tc.counter, tc.in)
			if id.Millis() != tc.ms || id.Counter() != tc.counter || id.Initiator() != tc.in {
				t.Fatalf("Make(%d, %d, %d) unpacks to (%d, %d, %d)",
					tc.ms, tc.counter, tc.in, id.Millis(), id.Counter(), id.Initiator())
			}
			if id.UnixMillis() != tc.ms+EpochUnixMillis {
				t.Fatalf("UnixMillis = %d, want %d", id.UnixMillis(), tc.ms+EpochUnixMillis)
			}
			if s := id.String(); s != tc.str {
				t.Fatalf("String = %q, want %q", s, tc.str)
			}
		})
	}
	if Make(0, 0, 0) != Zero {
		t.Fatal("Make(0, 0, 0) is not Zero")
	}
}

func TestMakeRejectsOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ms      int64
		counter uint32
		in      Initiator
	}{
		{"negative millis", -1, 0, 0},
		{"millis past max", MillisMax + 1, 0, 0},
		{"counter past max", 0, IDsPerMillisMax, 0},
		{"initiator past max", 0, 0, InitiatorsMax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatalf("Make(%d, %d, %d) did not panic", tc.ms, tc.counter, tc.in)
				}
			}()
			Make(tc.ms, tc.counter, tc.in)
		})
	}
}

// Integer order must be the lexicographic order of (millis, counter,
// initiator): that is what lets replicas compare IDs as plain integers.
func TestOrderIsLexicographic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	field := func() (int64, uint32, Initiator) {
		// Small ranges so that equal fields, and so the lower tie-breakers,
		// come up often.
		return rng.Int64N(4), rng.Uint32N(4), Initiator(rng.UintN(4))
	}
	for range 10_000 {
		am, ac, ai := field()
		bm, bc, bi := field()
		a, b := Make(am, ac, ai), Make(bm, bc, bi)
		var want bool
		switch {
		case am != bm:
			want = am < bm
		case ac != bc:
			want = ac < bc
		default:
			want = ai < bi
		}
		if got := a < b; got != want {
			t.Fatalf("%s < %s = %v, want %v", a, b, got, want)
		}
	}
}
