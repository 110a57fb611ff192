package node

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logEveryDefault is how often one repeating condition is logged.
const logEveryDefault = 5 * time.Second

// logKeysMax bounds the conditions a limiter tells apart; past it the
// oldest counts are dropped (their next occurrence logs at once).
const logKeysMax = 4096

// limitedLog logs a condition that repeats (a refusal, a failed dial, an
// unreachable etcd) at most once per interval per key, with the count of
// occurrences the interval swallowed, so a node in trouble writes lines a
// person can read rather than one per message. x/time/rate's Sometimes
// limits too, but it cannot say how many occurrences it dropped, and the
// count is what tells a transient hiccup from a storm.
type limitedLog struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu   sync.Mutex
	seen map[string]*logSeen
}

type logSeen struct {
	last       time.Time
	suppressed int
}

func newLimitedLog(log *slog.Logger, every time.Duration) *limitedLog {
	return &limitedLog{log: log, every: every, now: time.Now, seen: map[string]*logSeen{}}
}

// Log logs msg with args at level unless key was logged less than an
// interval ago; then it only counts. The line that ends a quiet interval
// says how many were not logged ("repeats").
func (l *limitedLog) Log(level slog.Level, key, msg string, args ...any) {
	now := l.now()
	l.mu.Lock()
	s := l.seen[key]
	if s != nil && now.Sub(s.last) < l.every {
		s.suppressed++
		l.mu.Unlock()
		return
	}
	if s == nil {
		if len(l.seen) >= logKeysMax {
			clear(l.seen)
		}
		s = &logSeen{}
		l.seen[key] = s
	}
	n, prev := s.suppressed, s.last
	s.last, s.suppressed = now, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "repeats", n, "since", now.Sub(prev).Round(time.Millisecond))
	}
	l.log.Log(context.Background(), level, msg, args...)
}
