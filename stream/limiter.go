package stream

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// limiter paces writes to an average of rate bytes per second. A write
// takes its bytes at once and may leave the bucket in debt; the next write
// waits until the debt is paid. So a frame larger than the burst still
// goes out, and the average holds over any stretch longer than one frame.
type limiter struct {
	mu    sync.Mutex
	rate  float64 // bytes per second
	burst float64 // the most credit that builds up while idle
	// tokens is the credit in bytes; negative is debt. Invariant:
	// tokens <= burst.
	tokens float64
	last   time.Time
	now    func() time.Time
}

func newLimiter(bytesPerSec int64, now func() time.Time) *limiter {
	r := float64(bytesPerSec)
	// A tenth of a second of credit smooths small frames without letting
	// an idle link burst far above its rate.
	return &limiter{rate: r, burst: r / 10, tokens: r / 10, last: now(), now: now}
}

// reserve takes n bytes and returns how long to wait before writing them.
func (l *limiter) reserve(n int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.now()
	l.tokens = min(l.burst, l.tokens+t.Sub(l.last).Seconds()*l.rate)
	l.last = t
	l.tokens -= float64(n)
	if l.tokens >= 0 {
		return 0
	}
	return time.Duration(-l.tokens / l.rate * float64(time.Second))
}

// wait takes n bytes and blocks until they may be written, ctx ends, or
// closed closes.
func (l *limiter) wait(ctx context.Context, n int, closed <-chan struct{}) error {
	d := l.reserve(n)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stream: rate limit wait: %w", ctx.Err())
	case <-closed:
		return fmt.Errorf("%w (rate limit wait)", ErrClosed)
	}
}
