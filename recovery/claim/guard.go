package claim

import (
	"errors"
	"fmt"
)

// Guard is what the holder of a claim decides, and nothing else: when its
// next keepalive and check are due, whether the claim is still certainly
// its own (the lease guard), when it must count the claim lost, and when
// its task record is due a touch. It does no I/O and reads no clock: every
// call takes the time, in ticks of the driver's choosing. Claim drives it
// with wall time (Unix nanoseconds) around etcd's answers; the simulator
// (recovery/sim) drives the same rules with its ticks around its model of
// etcd, so a seed exercises the holder the node runs.
//
// Invariants, by the times given to it:
//   - lastOK is the send time of the latest check that found the claim
//     ours (at first, the claim's creation); while the claim is held the
//     next check is never scheduled past lastOK+Window, and at
//     lastOK+Window without a newer one the claim is lost (ErrUnreachable):
//     Lost within one window of the claim stopping to be ours, reachable or
//     not.
//   - Held is false from min(lastOK+Window, lastKA+TTL/2) on, and forever
//     once the claim is lost or released.
//   - A touch is due only when the attempt's progress moved since the last
//     touch and a window has passed since it: at most one record write per
//     window, and the record's age stays within a window of the time since
//     the attempt last moved (docs/DESIGN.md, "Liveness by progress,
//     acknowledged handoff").
type Guard struct {
	cfg       GuardConfig
	lastOK    int64 // send time of the latest check that found the claim ours
	lastKA    int64 // arrival of the latest keepalive answer
	nextKA    int64
	nextCheck int64
	touchedAt int64
	touched   uint64
	err       error // nil while held
}

// GuardConfig is a guard's timing, in ticks.
type GuardConfig struct {
	// TTL is the claim's lease, as granted.
	TTL int64
	// Window is the check window, in (0, TTL/2]: see WithWindow.
	Window int64
	// Keepalive is the interval between keepalives, in (0, TTL/2]; 0 when
	// the driver's client keeps the lease alive on its own schedule (etcd's
	// does, at a third of the TTL) and only reports the answers.
	Keepalive int64
	// ChecksPerWindow is how many checks a window holds (0:
	// ChecksPerWindow, the package's).
	ChecksPerWindow int64
}

func (c GuardConfig) validate() error {
	switch {
	case c.TTL <= 0 || c.Window < 2 || 2*c.Window > c.TTL:
		// Two ticks at least: a check must fit inside the window, before
		// its end, where a window without an answer is a loss.
		return fmt.Errorf("%w: guard ttl %d, window %d: want window in [2, ttl/2]", ErrConfig, c.TTL, c.Window)
	case c.Keepalive < 0 || 2*c.Keepalive > c.TTL:
		return fmt.Errorf("%w: guard ttl %d, keepalive %d: want keepalive in [0, ttl/2]", ErrConfig, c.TTL, c.Keepalive)
	case c.ChecksPerWindow < 0:
		return fmt.Errorf("%w: guard checks per window %d", ErrConfig, c.ChecksPerWindow)
	}
	return nil
}

// NewGuard starts the guard of a claim created at now (the send time of
// the creating transaction: the claim is ours from then on).
func NewGuard(cfg GuardConfig, now int64) (*Guard, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.ChecksPerWindow == 0 {
		cfg.ChecksPerWindow = ChecksPerWindow
	}
	g := &Guard{cfg: cfg, lastOK: now, lastKA: now, touchedAt: now}
	g.nextCheck = now + g.checkInterval()
	if cfg.Keepalive > 0 {
		g.nextKA = now + cfg.Keepalive
	}
	return g, nil
}

// Config returns the guard's timing.
func (g *Guard) Config() GuardConfig { return g.cfg }

func (g *Guard) checkInterval() int64 { return max(1, g.cfg.Window/g.cfg.ChecksPerWindow) }

// Due says what the holder must do at now: send a keepalive, send a check
// (whose send time goes to OnCheck). Both are scheduled on by the call, as
// if sent. First it counts the claim lost (ErrUnreachable) if no check has
// found it ours for a whole window. Nothing is due once the claim is lost.
func (g *Guard) Due(now int64) (keepalive, check bool) {
	if g.err != nil {
		return false, false
	}
	if now >= g.lastOK+g.cfg.Window {
		g.end(fmt.Errorf("%w: %w: no check answered since %d", ErrLost, ErrUnreachable, g.lastOK))
		return false, false
	}
	if g.cfg.Keepalive > 0 && now >= g.nextKA {
		keepalive = true
		g.nextKA = now + g.cfg.Keepalive
	}
	if now >= g.nextCheck {
		check = true
		g.nextCheck = g.checkDeadline(now)
	}
	return keepalive, check
}

// NextCheck is when the next check is due.
func (g *Guard) NextCheck() int64 { return g.nextCheck }

// CheckDeadline is when a check sent at now must have its answer: the end
// of the window, past which the claim is lost as unreachable.
func (g *Guard) CheckDeadline() int64 { return g.lastOK + g.cfg.Window }

// checkDeadline schedules the next check a check interval after now, and
// never past the window's end.
func (g *Guard) checkDeadline(now int64) int64 {
	return min(now+g.checkInterval(), g.lastOK+g.cfg.Window)
}

// OnKeepalive takes a keepalive's answer, arrived at now: alive is false
// when the lease is gone (expired, revoked, or the client gave up on it),
// and the claim is then lost. An unanswered keepalive is not reported.
func (g *Guard) OnKeepalive(now int64, alive bool) {
	if g.err != nil {
		return
	}
	if !alive {
		g.end(fmt.Errorf("%w: %w", ErrLost, ErrKeepAliveEnded))
		return
	}
	g.lastKA = max(g.lastKA, now)
}

// OnCheck takes the answer of a check sent at sentAt: err is nil when the
// claim key is still ours, ErrClaimGone or ErrSuperseded (wrapped or not)
// when it is not, and the claim is then lost. Any other error is a check
// that did not get through: the next one retries while the window lasts.
func (g *Guard) OnCheck(sentAt int64, err error) {
	if g.err != nil {
		return
	}
	switch {
	case err == nil:
		if sentAt > g.lastOK {
			g.lastOK = sentAt
			g.nextCheck = min(g.nextCheck, g.lastOK+g.cfg.Window)
		}
	case errors.Is(err, ErrClaimGone), errors.Is(err, ErrSuperseded):
		g.end(fmt.Errorf("%w: %w", ErrLost, err))
	}
}

// Held is the lease guard: whether at now the claim is certainly still
// ours, so its holder may send or make durable anything of the attempt.
// It is true until the earlier of a window after the latest check that
// found the key ours (the checks' own promise) and half a TTL after the
// latest keepalive answer: for another holder to claim, our lease must
// have gone a whole TTL without a refresh, and the refresh behind that
// answer was sent at most one round trip before it arrived; with round
// trips under TTL/2 the lease outlives the deadline. A holder woken from a
// pause finds it false before it does anything, where its checks would
// tell it only at the next one (Claim.Held says the same for the node).
func (g *Guard) Held(now int64) bool {
	return g.err == nil && now < g.HeldUntil()
}

// HeldUntil is the lease guard's deadline (see Held).
func (g *Guard) HeldUntil() int64 {
	return min(g.lastOK+g.cfg.Window, g.lastKA+g.cfg.TTL/2)
}

// LeaseDeadline is when the lease runs out as the holder reckons it: a TTL
// after the latest keepalive answer (the refresh behind it was sent before,
// so etcd's deadline is no later).
func (g *Guard) LeaseDeadline() int64 { return g.lastKA + g.cfg.TTL }

// MaybeTouch reports whether the task record is due a touch (claim.Touch)
// at now, given the attempt's progress count, and if so takes it as
// touched: the attempt made progress since the last touch, and a window
// has passed since it, while the claim is held. A rejoin that moves on
// thus refreshes its record once a window and is never stale however long
// it runs; one that stalls stops refreshing it and the health task
// (StaleReason) resets it (docs/DESIGN.md, "Liveness by progress,
// acknowledged handoff").
func (g *Guard) MaybeTouch(now int64, progress uint64) bool {
	if g.err != nil || progress == g.touched || now-g.touchedAt < g.cfg.Window {
		return false
	}
	g.touched, g.touchedAt = progress, now
	return true
}

// Lost reports whether the claim is no longer held (lost or released).
func (g *Guard) Lost() bool { return g.err != nil }

// Err is nil while the claim is held, then why it ended (the first reason).
func (g *Guard) Err() error { return g.err }

// Release ends the guard: the holder gave the claim back.
func (g *Guard) Release() { g.end(ErrReleased) }

// LoseWith ends the guard for a reason the driver learned itself (the
// keepalive stream ended, a completion deleted the claim).
func (g *Guard) LoseWith(err error) { g.end(fmt.Errorf("%w: %w", ErrLost, err)) }

func (g *Guard) end(why error) {
	if g.err == nil {
		g.err = why
	}
}
