package demo

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A node process that exited does not come back: the poll that finds it
// ends with its error at once, instead of retrying it until its bound
// (10 minutes for the rejoin) and only then reporting it.
func TestPollHalts(t *testing.T) {
	exited := errors.New("n1 exited: exit status 2")
	calls := 0
	err := Poll(context.Background(), 2*time.Second, "every replica live", func() (bool, error) {
		calls++
		return false, Halt(exited)
	})
	if !errors.Is(err, exited) || errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Fatalf("Poll with a halting error: %v after %d calls, want %q after 1", err, calls, exited)
	}
}

// Any other error is one a later call may not have: a node restarting
// does not answer yet.
func TestPollRetries(t *testing.T) {
	calls := 0
	err := Poll(context.Background(), 5*time.Second, "every replica answering", func() (bool, error) {
		calls++
		if calls < 3 {
			return false, errors.New("n2: connection refused")
		}
		return true, nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Poll: %v after %d calls, want success after 3", err, calls)
	}
}

func TestExitedHalts(t *testing.T) {
	p := &proc{done: make(chan struct{}), err: errors.New("signal: killed")}
	close(p.done)
	ps := &procs{cur: map[int]*proc{1: p}}
	err := ps.exited()
	var h haltError
	if err == nil || !errors.As(err, &h) {
		t.Fatalf("exited() = %v, want an error that halts a poll", err)
	}
}
