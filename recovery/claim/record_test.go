package claim

import (
	"errors"
	"testing"
	"time"
)

// TestRecordMoves checks the table of legal moves against what the
// transition functions can produce: every move they make is legal, and an
// illegal one panics (a bug, not an operating error).
func TestRecordMoves(t *testing.T) {
	checkLeaks(t)
	for from := StatusPending; from <= StatusFailed; from++ {
		for to := StatusPending; to <= StatusFailed; to++ {
			r := Record{Status: from}
			panicked := func() (p bool) {
				defer func() { p = recover() != nil }()
				r.move(to)
				return false
			}()
			if panicked == legalMoves[from][to] {
				t.Errorf("%s -> %s: legal %v, panicked %v", from, to, legalMoves[from][to], panicked)
			}
		}
	}
	for _, s := range []Status{0, StatusFailed + 1} {
		if _, err := s.MarshalText(); err == nil {
			t.Errorf("%s marshalled", s)
		}
	}
	for s := StatusPending; s <= StatusFailed; s++ {
		b, _ := s.MarshalText()
		var back Status
		if err := back.UnmarshalText(b); err != nil || back != s {
			t.Errorf("%s: round trip gave %s, %v", s, back, err)
		}
	}
}

// TestRecordRules covers the rules of the pure transition functions that
// the scripts do not reach.
func TestRecordRules(t *testing.T) {
	checkLeaks(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	task := Task{Partition: 1, Dest: "n"}
	a := Attempt{Task: task, Executor: "a", Epoch: 10}
	running := Record{Status: StatusRunning, Attempts: 1, Executor: "a", Epoch: 10, UpdatedAt: now, Opened: 5}

	// A takeover needs a higher epoch than the running attempt's.
	if _, _, err := StartRecord(running, Attempt{Task: task, Executor: "b", Epoch: 9}, now); !errors.Is(err, ErrStaleEpoch) {
		t.Errorf("lower epoch took over: %v", err)
	}
	if _, _, err := StartRecord(running, Attempt{Task: task, Executor: "b", Epoch: 10}, now); !errors.Is(err, ErrStaleEpoch) {
		t.Errorf("same epoch, other executor took over: %v", err)
	}
	// A pending task accepts a completion (its attempt was reset as stale
	// but had finished).
	pending := toPending(running, "reset", now)
	if r, err := DoneRecord(pending, a, now.Add(time.Second)); err != nil || r.Status != StatusDone || r.Executor != "a" {
		t.Errorf("completion of a reset task: %+v %v", r, err)
	}
	// Staleness is strictly older than staleAfter, by the time passed in.
	if why := StaleReason(running, 10, now.Add(30*time.Second), 30*time.Second); why != "" {
		t.Errorf("stale at exactly staleAfter: %s", why)
	}
	if why := StaleReason(running, 10, now.Add(30*time.Second+1), 30*time.Second); why == "" {
		t.Error("not stale past staleAfter")
	}
	if why := StaleReason(pending, 0, now.Add(time.Hour), time.Second); why != "" {
		t.Errorf("pending task stale: %s", why)
	}
}
