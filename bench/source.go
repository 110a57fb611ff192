package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/wire"
)

// sourceDriver is the thin driver of the source replica's core
// (recovery.Replica): it executes the feed from the start, and from the
// start signal serves a source attempt on the same goroutine; the core
// pumps it between txns, and the driver ticks it and hands it the
// destination's frames.
type sourceDriver struct {
	replica
	cfg recovery.SourceConfig
	// start is closed by Run to begin the rejoin; nil once begun.
	start <-chan struct{}
	proc  *recovery.Source

	// Written before done is closed, read by Run after.
	//
	// holdAt is when the source began holding execution for the handoff:
	// the start of the call in which its state became handing-off (or
	// done, when both happened in one call), so the pause is never under-
	// reported. releasedAt is when it was first seen to have sent the
	// Handoff, which ends the hold; doneAt when it was first seen done
	// (the destination's HandoffAck came back).
	holdAt, releasedAt, doneAt time.Time
	executedAtDone             int64
	metrics                    recovery.Metrics
	// queuePeak is the most txns queued at the source while the rejoin ran:
	// how far execution fell behind the feed.
	queuePeak int
	done      chan struct{}
}

func (s *sourceDriver) run(ctx context.Context) error { return s.loop(ctx, s) }

func (s *sourceDriver) onBatch(b *batch) error {
	for _, inv := range b.txns {
		if !s.core.OnTxn(inv) {
			return s.refused(inv.ID)
		}
	}
	if b.heartbeat != 0 && !s.core.OnHeartbeat(b.heartbeat) {
		return s.refused(b.heartbeat)
	}
	if b.end {
		s.takeEnd(b)
	}
	if s.proc != nil && !s.proc.State().Final() {
		s.queuePeak = max(s.queuePeak, s.exec.Queued())
	}
	return nil
}

func (s *sourceDriver) onMessage(m wire.Message) error {
	var err error
	if cerr := s.call(func() { err = s.core.OnSourceMessage(s.cfg.Header.Epoch, m) }); cerr != nil {
		return cerr
	}
	if err != nil {
		// Nothing is refused in an in-process run: no stale epochs, no
		// other partitions. A refusal is a bug worth failing on.
		return fmt.Errorf("bench: source: %v: %w", m.Type(), err)
	}
	return nil
}

func (s *sourceDriver) onTick() error {
	if s.proc == nil {
		return nil
	}
	return s.call(s.core.Tick)
}

func (s *sourceDriver) control() <-chan struct{} { return s.start }

func (s *sourceDriver) onControl() error {
	s.start = nil
	if err := s.core.StartSource("destination", s.cfg); err != nil {
		return fmt.Errorf("bench: source: %w", err)
	}
	s.proc = s.core.Source()
	return nil
}

func (s *sourceDriver) work() (bool, error) {
	if s.proc == nil || s.proc.State().Final() {
		return s.step(nil)
	}
	return s.step(s.call)
}

func (s *sourceDriver) outbox() []wire.Message { return s.messages() }

func (s *sourceDriver) linkOpen() bool { return s.proc != nil }

func (s *sourceDriver) finished() (bool, error) {
	if s.ending && (s.proc == nil || s.proc.State() != recovery.StateDone) {
		return false, fmt.Errorf("bench: source: the feed ended before the rejoin was done")
	}
	return s.maybeFinish()
}

// call runs one call into the processor and looks at its state after:
// the handoff's start and end times, and an abort.
func (s *sourceDriver) call(f func()) error {
	if s.proc.State().Final() {
		f()
		return nil
	}
	before := time.Now()
	f()
	switch s.proc.State() {
	case recovery.StateHandingOff:
		if s.holdAt.IsZero() {
			s.holdAt = before
		}
		if s.releasedAt.IsZero() && s.proc.HandoffSent() {
			s.releasedAt = time.Now()
		}
	case recovery.StateDone:
		if s.holdAt.IsZero() {
			s.holdAt = before
		}
		s.doneAt = time.Now()
		if s.releasedAt.IsZero() {
			s.releasedAt = s.doneAt
		}
		s.executedAtDone = s.executed.Load()
		s.metrics = s.proc.Metrics()
		close(s.done)
	case recovery.StateAborted:
		return fmt.Errorf("bench: source: %w", s.proc.Err())
	}
	return nil
}
