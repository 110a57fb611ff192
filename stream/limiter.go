package stream

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"
)

// newLimiter paces a connection's writes to an average of bytesPerSec,
// with a tenth of a second of credit: enough to smooth small frames
// without letting an idle link burst far above its rate. A frame larger
// than the credit still goes out (reserveBytes).
func newLimiter(bytesPerSec int64) *rate.Limiter {
	return rate.NewLimiter(rate.Limit(bytesPerSec), max(1, int(bytesPerSec/10)))
}

// WaitBytes takes n bytes of lim and blocks until they may be written.
// Before a wait it calls flush, if set: what was written before must not
// wait with these bytes. It ends early if ctx ends or stop closes (the
// connection is closed or replaced), and then gives the bytes back. An
// unlimited lim costs no wait and no flush.
func WaitBytes(ctx context.Context, lim *rate.Limiter, n int, stop <-chan struct{}, flush func() error) error {
	d, rs := reserveBytes(lim, time.Now(), n)
	if d <= 0 {
		return nil
	}
	if flush != nil {
		if err := flush(); err != nil {
			cancelBytes(rs, time.Now())
			return err
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		cancelBytes(rs, time.Now())
		return fmt.Errorf("stream: rate limit wait: %w", ctx.Err())
	case <-stop:
		cancelBytes(rs, time.Now())
		return fmt.Errorf("%w (rate limit wait)", ErrClosed)
	}
}

// reserveBytes takes n bytes of lim at now and returns how long to wait
// before writing them, with the reservations made. rate.Limiter refuses
// a reservation above its burst, and a frame may be larger: it is taken
// in pieces of at most the burst, each queued behind the last, so the
// wait for the last is the frame's and the average holds over any
// stretch longer than a frame. An unlimited lim, or one whose limit
// changed under the pieces, costs no wait.
func reserveBytes(lim *rate.Limiter, now time.Time, n int) (time.Duration, []*rate.Reservation) {
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

// cancelBytes gives back, at now, the bytes of reservations whose frame
// will not be written. Last first: rate.Limiter restores a reservation's
// tokens in full only while no later one is queued behind it.
func cancelBytes(rs []*rate.Reservation, now time.Time) {
	for i := len(rs) - 1; i >= 0; i-- {
		rs[i].CancelAt(now)
	}
}
