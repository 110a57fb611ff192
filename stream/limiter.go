package stream

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"
)

// limiter paces writes to an average of rate bytes per second, on
// golang.org/x/time/rate with a tenth of a second of credit: enough to
// smooth small frames without letting an idle link burst far above its
// rate. A frame larger than the credit still goes out (ReserveBytes).
type limiter struct {
	lim *rate.Limiter
	now func() time.Time
}

func newLimiter(bytesPerSec int64, now func() time.Time) *limiter {
	return &limiter{lim: rate.NewLimiter(rate.Limit(bytesPerSec), max(1, int(bytesPerSec/10))), now: now}
}

// reserve takes n bytes and returns how long to wait before writing them,
// and a cancel that gives them back.
func (l *limiter) reserve(n int) (time.Duration, func()) {
	now := l.now()
	d, rs := ReserveBytes(l.lim, now, n)
	return d, func() { CancelBytes(rs, l.now()) }
}

// wait takes n bytes and blocks until they may be written, ctx ends, or
// closed closes; a wait that ends early gives the bytes back.
func (l *limiter) wait(ctx context.Context, n int, closed <-chan struct{}) error {
	d, cancel := l.reserve(n)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		cancel()
		return fmt.Errorf("stream: rate limit wait: %w", ctx.Err())
	case <-closed:
		cancel()
		return fmt.Errorf("%w (rate limit wait)", ErrClosed)
	}
}

// ReserveBytes takes n bytes of lim at now and returns how long to wait
// before writing them, with the reservations made. rate.Limiter refuses
// a reservation above its burst, and a frame may be larger: it is taken
// in pieces of at most the burst, each queued behind the last, so the
// wait for the last is the frame's and the average holds over any
// stretch longer than a frame. An unlimited lim, or one whose limit
// changed under the pieces, costs no wait.
func ReserveBytes(lim *rate.Limiter, now time.Time, n int) (time.Duration, []*rate.Reservation) {
	if lim.Limit() == rate.Inf {
		return 0, nil
	}
	var rs []*rate.Reservation
	var d time.Duration
	for burst := max(1, lim.Burst()); n > 0; n -= burst {
		r := lim.ReserveN(now, min(n, burst))
		if !r.OK() {
			return 0, rs
		}
		rs = append(rs, r)
		d = r.DelayFrom(now)
	}
	return d, rs
}

// CancelBytes gives back, at now, the bytes of reservations whose frame
// will not be written. Last first: rate.Limiter restores a reservation's
// tokens in full only while no later one is queued behind it.
func CancelBytes(rs []*rate.Reservation, now time.Time) {
	for i := len(rs) - 1; i >= 0; i-- {
		rs[i].CancelAt(now)
	}
}
