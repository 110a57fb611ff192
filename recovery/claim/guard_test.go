package claim

import (
	"errors"
	"fmt"
	"testing"
)

// TestGuardSchedule: checks come ChecksPerWindow times a window and
// keepalives every Keepalive ticks; an answered check moves the window on.
func TestGuardSchedule(t *testing.T) {
	g, err := NewGuard(GuardConfig{TTL: 100, Window: 40, Keepalive: 30}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var checks, kas []int64
	for now := int64(1); now <= 100; now++ {
		ka, ck := g.Due(now)
		if ka {
			kas = append(kas, now)
			g.OnKeepalive(now, true)
		}
		if ck {
			checks = append(checks, now)
			g.OnCheck(now, nil)
		}
	}
	if got, want := fmt.Sprint(checks), "[10 20 30 40 50 60 70 80 90 100]"; got != want {
		t.Fatalf("checks at %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(kas), "[30 60 90]"; got != want {
		t.Fatalf("keepalives at %s, want %s", got, want)
	}
	if !g.Held(100) || g.Lost() {
		t.Fatalf("held %v, lost %v (%v), want held", g.Held(100), g.Lost(), g.Err())
	}
}

// TestGuardLoss: a check that finds the key gone or superseded loses the
// claim at once; a window without an answered check loses it as
// unreachable, exactly at lastOK+Window; a keepalive refused loses it.
func TestGuardLoss(t *testing.T) {
	for _, tc := range []struct {
		name   string
		run    func(g *Guard) int64 // returns when the loss was declared
		want   error
		atTick int64
	}{
		{"gone", func(g *Guard) int64 { g.OnCheck(5, ErrClaimGone); return 5 }, ErrClaimGone, 5},
		{"superseded", func(g *Guard) int64 { g.OnCheck(5, fmt.Errorf("%w: x", ErrSuperseded)); return 5 }, ErrSuperseded, 5},
		{"keepalive", func(g *Guard) int64 { g.OnKeepalive(7, false); return 7 }, ErrKeepAliveEnded, 7},
		{"unreachable", func(g *Guard) int64 {
			// Checks go out but no answer comes: at lastOK(0)+40 it is lost.
			for now := int64(1); ; now++ {
				g.Due(now)
				if g.Lost() {
					return now
				}
			}
		}, ErrUnreachable, 40},
		{"unreachable after an answer", func(g *Guard) int64 {
			for now := int64(1); ; now++ {
				if _, ck := g.Due(now); ck && now == 10 {
					g.OnCheck(now, nil)
				}
				if g.Lost() {
					return now
				}
			}
		}, ErrUnreachable, 50},
		{"a failed read is no loss", func(g *Guard) int64 {
			g.OnCheck(5, errors.New("context deadline exceeded"))
			if g.Lost() {
				return 5
			}
			g.Release()
			return 6
		}, ErrReleased, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := NewGuard(GuardConfig{TTL: 100, Window: 40}, 0)
			if err != nil {
				t.Fatal(err)
			}
			at := tc.run(g)
			if !errors.Is(g.Err(), tc.want) || at != tc.atTick {
				t.Fatalf("lost at %d with %v, want %v at %d", at, g.Err(), tc.want, tc.atTick)
			}
			if tc.want != ErrReleased && !errors.Is(g.Err(), ErrLost) {
				t.Fatalf("err %v does not wrap ErrLost", g.Err())
			}
			if g.Held(at) {
				t.Fatalf("held after the loss")
			}
			if ka, ck := g.Due(at + 1); ka || ck {
				t.Fatalf("something due after the loss")
			}
		})
	}
}

// TestGuardHeld: the lease guard's deadline is the earlier of a window
// after the latest answered check and half a TTL after the latest
// keepalive answer; a holder paused past it is not held when it wakes,
// before any check.
func TestGuardHeld(t *testing.T) {
	g, err := NewGuard(GuardConfig{TTL: 100, Window: 40}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if g.HeldUntil() != 40 || !g.Held(39) || g.Held(40) {
		t.Fatalf("held until %d, want 40 (by the check)", g.HeldUntil())
	}
	g.OnCheck(30, nil)
	if g.HeldUntil() != 50 {
		t.Fatalf("held until %d after a check at 30 and no keepalive answer, want 50 (TTL/2)", g.HeldUntil())
	}
	g.OnKeepalive(35, true)
	if g.HeldUntil() != 70 || g.LeaseDeadline() != 135 {
		t.Fatalf("held until %d, lease deadline %d; want 70 and 135", g.HeldUntil(), g.LeaseDeadline())
	}
	// A pause from 36 to 500: at wake the guard says no, before any check.
	if g.Held(500) {
		t.Fatal("held at 500 after a pause")
	}
}

// TestGuardTouch: a touch is due when the progress moved since the last
// one and a window has passed, never more than once a window, and never
// when nothing moved, however long.
func TestGuardTouch(t *testing.T) {
	g, err := NewGuard(GuardConfig{TTL: 100, Window: 40}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var touches []int64
	for now := int64(1); now <= 200; now++ {
		progress := uint64(now) // moves every tick
		if now > 120 {
			progress = 120 // then stalls
		}
		if now%10 == 0 {
			g.OnCheck(now, nil)
		}
		if g.MaybeTouch(now, progress) {
			touches = append(touches, now)
		}
	}
	if got, want := fmt.Sprint(touches), "[40 80 120]"; got != want {
		t.Fatalf("touched at %s, want %s", got, want)
	}
	g.Release()
	if g.MaybeTouch(500, 500) {
		t.Fatal("touch due after release")
	}
}

// TestGuardConfig: a window or keepalive above half the TTL is refused.
func TestGuardConfig(t *testing.T) {
	for _, c := range []GuardConfig{{TTL: 0, Window: 1}, {TTL: 10, Window: 6}, {TTL: 10, Window: 5, Keepalive: 6}, {TTL: 10, Window: 0}, {TTL: 10, Window: 1}, {TTL: 10, Window: 5, ChecksPerWindow: -1}} {
		if _, err := NewGuard(c, 0); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", c, err)
		}
	}
}
