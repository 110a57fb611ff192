package supervise

import (
	"errors"
	"fmt"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/wire"
)

// Holding is one rejoin attempt as the node holding its claim lives it,
// from the claim acquired to the claim released (docs/DESIGN.md "The
// attempt core"): start the task, connect to the destination, start the
// source on the replica core, redial and resume a connection that broke,
// abort the source when the claim is lost or the connection stays out,
// complete the task or requeue it, release the claim, and say when the
// assignment is to be taken again. It is the third pure core beside
// recovery.Replica and recovery.Initiator: results and ticks in, actions
// out (Outbox), no goroutine, clock or etcd client. recovery/node drives
// it with wall time around etcd, its connections and its replica's
// goroutine; recovery/sim with its ticks around its models of those, so a
// seed runs the attempt the node runs.
//
// It lives here, not in recovery, because its words are the claim's and
// the supervisor's (claim.ErrTaskFinal, a requeue, a retry of the
// assignment), and recovery stands below both. The claim's own timing (its
// keepalives, checks and touches, the lease guard) is claim.Guard's; a
// Holding hears only its verdict (ClaimLost).
//
// Rules, each once a rule written in recovery/node's source side alone:
//   - A task that will not start ends the attempt: the claim is released
//     and the assignment is not taken again (a newer one will be).
//   - A first connection or a first source start that fails ends the
//     attempt before its source: the task is requeued.
//   - A connection that breaks once the source runs is redialled, every
//     RedialEvery ticks, for ResumeGrace ticks after the break; a dial
//     that connects resumes the source. Past the grace, or once the
//     source has held its partition's txns for the destination for
//     BrokenHoldMax ticks since the break (recovery.Source.HoldsPartition:
//     the partition's writes wait meanwhile), the source is aborted
//     (wire.AbortConnLost).
//   - A claim lost aborts a running source (wire.AbortClaimLost); before
//     the source runs, it closes the connection and ends the attempt.
//   - A source done (its HandoffAck came back) completes the task; a
//     source that ended otherwise requeues it. A requeue refused as final
//     (claim.ErrTaskFinal: the destination completed the task itself) is
//     not retried; any other failed attempt is taken again RetryAfter
//     ticks after its requeue, as a new claim at a higher epoch.
//   - The node stopping requeues the task (aborting a running source) and
//     retries nothing.
//   - The claim is released last, whatever the outcome, and exactly once.
type Holding struct {
	cfg   HoldingConfig
	state holdState
	// started: the source was started on the replica core (first
	// connection answered); from then a break is resumable.
	started bool
	// brokeAt is when the connection broke; dialAt when the next redial is
	// due; dialing says a dial is out, whatever the state: its connection,
	// if it comes, is closed unless the attempt still wants it.
	brokeAt, dialAt int64
	dialing         bool
	// lastErr is the last redial's failure, for the abort's text.
	lastErr error
	// why is what the attempt's end is requeued with.
	why error
	// completing: the finish asked was Complete (else Requeue).
	completing bool
	// stopping: the node is stopping; nothing is retried.
	stopping bool
	// outcome is how the attempt ended, once Released.
	outcome HoldOutcome
	out     []HoldAction
}

// HoldingConfig is a Holding's timing, in ticks of the driver's choosing.
type HoldingConfig struct {
	// ResumeGrace: how long after a break a source redials before it gives
	// the attempt up. The destination keeps its attempt about as long.
	ResumeGrace int64
	// BrokenHoldMax: how long a source holds its partition's txns for a
	// destination it has no connection to before it gives the attempt up.
	BrokenHoldMax int64
	// RedialEvery spaces the redials of a broken connection.
	RedialEvery int64
	// RetryAfter: how long after a failed attempt's requeue its assignment
	// is taken again.
	RetryAfter int64
}

func (c HoldingConfig) validate() error {
	if c.ResumeGrace < 0 || c.BrokenHoldMax < 0 || c.RedialEvery <= 0 || c.RetryAfter < 0 {
		return fmt.Errorf("%w: holding: grace %d, hold %d, redial every %d, retry after %d ticks", ErrConfig, c.ResumeGrace, c.BrokenHoldMax, c.RedialEvery, c.RetryAfter)
	}
	return nil
}

type holdState int

const (
	holdStarting       holdState = iota // StartTask asked
	holdDialing                         // the first Dial asked
	holdStartingSource                  // StartSource asked
	holdRunning                         // the source runs on a connection
	holdBroken                          // the connection broke; redialling
	holdResuming                        // ResumeSource asked
	holdAborting                        // AbortSource asked; its end awaited
	holdFinishing                       // Complete or Requeue asked
	holdReleased                        // Release asked: over
)

var holdStateNames = [...]string{"starting", "dialing", "starting-source", "running", "broken", "resuming", "aborting", "finishing", "released"}

func (s holdState) String() string { return holdStateNames[s] }

// HoldActionKind is what a Holding asks of its driver.
type HoldActionKind int

const (
	// HoldStartTask: mark the task started (claim.StartTask); answer
	// TaskStarted.
	HoldStartTask HoldActionKind = iota + 1
	// HoldDial: connect to the destination and say the attempt's hello;
	// answer Connected once it is answered or failed.
	HoldDial
	// HoldStartSource: start the attempt's source on the replica core on
	// the new connection; answer SourceStarted.
	HoldStartSource
	// HoldResumeSource: resume the source on the new connection; answer
	// SourceStarted.
	HoldResumeSource
	// HoldAbortSource: abort the source (Reason, Why); its end comes as
	// SourceEnded.
	HoldAbortSource
	// HoldClose: close the attempt's connection (none will be needed).
	HoldClose
	// HoldComplete: complete the task (supervise.Complete); answer
	// Finished.
	HoldComplete
	// HoldRequeue: requeue the task (claim.Requeue) with Why; answer
	// Finished.
	HoldRequeue
	// HoldRelease: release the claim. The last action; no answer.
	HoldRelease
	// HoldRetry: take the assignment again (supervise.Taken.Retry) at tick
	// At.
	HoldRetry
)

var holdActionNames = [...]string{"", "start-task", "dial", "start-source", "resume-source", "abort-source", "close", "complete", "requeue", "release", "retry"}

func (k HoldActionKind) String() string {
	if k <= 0 || int(k) >= len(holdActionNames) {
		return fmt.Sprintf("HoldActionKind(%d)", int(k))
	}
	return holdActionNames[k]
}

// HoldAction is one thing a Holding asks of its driver.
type HoldAction struct {
	Kind HoldActionKind
	// Reason and Why: HoldAbortSource's abort; Why is HoldRequeue's text.
	Reason wire.AbortReason
	Why    string
	// At: HoldRetry's tick.
	At int64
	// GaveUp: the rule by which a HoldAbortSource gives a broken
	// connection up, if one did (drivers count them).
	GaveUp HoldGiveUp
}

// HoldGiveUp is the rule by which an attempt whose connection broke was
// given up.
type HoldGiveUp int

const (
	// GaveUpNone: not given up for a broken connection.
	GaveUpNone HoldGiveUp = iota
	// GaveUpGrace: no redial connected within ResumeGrace.
	GaveUpGrace
	// GaveUpHeld: the source held its partition for BrokenHoldMax with no
	// connection.
	GaveUpHeld
)

func (a HoldAction) String() string {
	switch a.Kind {
	case HoldAbortSource:
		return fmt.Sprintf("%s %s: %s", a.Kind, a.Reason, a.Why)
	case HoldRequeue:
		return fmt.Sprintf("%s: %s", a.Kind, a.Why)
	case HoldRetry:
		return fmt.Sprintf("%s at %d", a.Kind, a.At)
	}
	return a.Kind.String()
}

// HoldOutcome is how an attempt ended.
type HoldOutcome int

const (
	// HoldOpen: not over.
	HoldOpen HoldOutcome = iota
	// HoldNotStarted: the task would not start; nothing to requeue.
	HoldNotStarted
	// HoldCompleted: the source was done; the task completed (or the
	// completion failed, which the destination's own completion covers).
	HoldCompleted
	// HoldRequeued: the attempt failed and its task was requeued (or the
	// requeue failed); the assignment is taken again.
	HoldRequeued
	// HoldFinal: the attempt failed, but its task was final already.
	HoldFinal
	// HoldStopped: the node stopped; the task was requeued, nothing retried.
	HoldStopped
)

var holdOutcomeNames = [...]string{"open", "not-started", "completed", "requeued", "final", "stopped"}

func (o HoldOutcome) String() string { return holdOutcomeNames[o] }

// NewHolding starts the life of an attempt whose claim was just acquired,
// at tick now: its first action is HoldStartTask.
func NewHolding(cfg HoldingConfig, now int64) (*Holding, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h := &Holding{cfg: cfg}
	h.ask(HoldAction{Kind: HoldStartTask})
	return h, nil
}

// Outbox returns what the Holding asked since the last call, in order,
// and forgets it.
func (h *Holding) Outbox() []HoldAction {
	out := h.out
	h.out = nil
	return out
}

// Run hands every action asked to do, in order, until none is left: an
// answer do feeds back may ask more, which run in the same call. Both
// drivers work the outbox through it, so none stops at the first batch
// (one that did never released its claim after a requeue).
func (h *Holding) Run(do func(HoldAction)) {
	for acts := h.Outbox(); len(acts) > 0; acts = h.Outbox() {
		for _, a := range acts {
			do(a)
		}
	}
}

// Released reports whether the attempt is over (its claim's release asked).
func (h *Holding) Released() bool { return h.state == holdReleased }

// Outcome is how the attempt ended (HoldOpen until Released).
func (h *Holding) Outcome() HoldOutcome { return h.outcome }

// Started reports whether the attempt's source ever started.
func (h *Holding) Started() bool { return h.started }

// Broken reports whether the attempt's connection is broken and it
// redials.
func (h *Holding) Broken() bool { return h.state == holdBroken }

// State names the attempt's state, for traces and status.
func (h *Holding) State() string { return h.state.String() }

func (h *Holding) ask(a HoldAction) { h.out = append(h.out, a) }

// TaskStarted is the answer to HoldStartTask.
func (h *Holding) TaskStarted(now int64, err error) {
	if h.state != holdStarting {
		return
	}
	if err != nil {
		h.release(HoldNotStarted)
		return
	}
	h.state = holdDialing
	h.dialing = true
	h.ask(HoldAction{Kind: HoldDial})
}

// Connected is the answer to HoldDial: a connection whose hello the
// destination answered (err nil), or why there is none.
func (h *Holding) Connected(now int64, err error) {
	if !h.dialing {
		return
	}
	h.dialing = false
	switch h.state {
	case holdDialing:
		if err != nil {
			h.finish(fmt.Errorf("no connection to the destination: %w", err))
			return
		}
		h.state = holdStartingSource
		h.ask(HoldAction{Kind: HoldStartSource})
	case holdBroken:
		if err != nil {
			h.lastErr = err
			if now-h.brokeAt > h.cfg.ResumeGrace {
				h.giveUp(GaveUpGrace, fmt.Sprintf("no connection to the destination within the grace: %v", err))
				return
			}
			h.dialAt = now + h.cfg.RedialEvery
			return
		}
		h.state = holdResuming
		h.ask(HoldAction{Kind: HoldResumeSource})
	default:
		// The attempt moved on (a claim lost, a stop) while the dial was
		// out: its connection is not needed.
		if err == nil {
			h.ask(HoldAction{Kind: HoldClose})
		}
	}
}

// SourceStarted is the answer to HoldStartSource and HoldResumeSource.
func (h *Holding) SourceStarted(now int64, err error) {
	switch h.state {
	case holdStartingSource:
		if err != nil {
			h.ask(HoldAction{Kind: HoldClose})
			h.finish(err)
			return
		}
		h.started = true
		h.state = holdRunning
	case holdResuming:
		if err != nil {
			// The replica no longer runs the attempt, or refuses it: the
			// source's own end follows the abort.
			h.ask(HoldAction{Kind: HoldClose})
			h.abort(wire.AbortConnLost, fmt.Sprintf("resume refused: %v", err))
			return
		}
		h.state = holdRunning
	case holdFinishing, holdReleased:
		if err == nil {
			// Started while the attempt ended (a claim lost, a stop): it
			// must not run without a holder.
			h.ask(HoldAction{Kind: HoldAbortSource, Reason: wire.AbortClaimLost, Why: wire.ErrText(h.why)})
		}
	}
}

// Broke says the attempt's connection broke (read or write failed, or the
// peer closed it) while its source runs.
func (h *Holding) Broke(now int64) {
	if h.state != holdRunning {
		return
	}
	h.state, h.brokeAt = holdBroken, now
	h.dialing = true
	h.ask(HoldAction{Kind: HoldDial})
}

// Tick moves the attempt's timers on to now. holds says whether the
// source holds its partition's txns for the destination (its hold, or the
// handoff's pause: recovery.Source.HoldsPartition).
func (h *Holding) Tick(now int64, holds bool) {
	if h.state != holdBroken {
		return
	}
	if holds && now-h.brokeAt >= h.cfg.BrokenHoldMax {
		h.giveUp(GaveUpHeld, fmt.Sprintf("the partition's txns held %d ticks with no connection to the destination", now-h.brokeAt))
		return
	}
	if h.dialing || now < h.dialAt {
		return
	}
	if now-h.brokeAt > h.cfg.ResumeGrace {
		h.giveUp(GaveUpGrace, fmt.Sprintf("no connection to the destination within the grace: %v", h.lastErr))
		return
	}
	h.dialing = true
	h.ask(HoldAction{Kind: HoldDial})
}

// ClaimLost says the claim is no longer certainly this attempt's (the
// lease guard, or a check that found it gone).
func (h *Holding) ClaimLost(now int64, why string) {
	switch h.state {
	case holdStarting:
		h.release(HoldNotStarted)
	case holdDialing:
		// The dial's connection, when it comes, is closed (Connected).
		h.finish(fmt.Errorf("claim lost before the source started: %s", why))
	case holdStartingSource:
		h.ask(HoldAction{Kind: HoldClose})
		h.finish(fmt.Errorf("claim lost before the source started: %s", why))
	case holdRunning, holdBroken, holdResuming:
		h.abort(wire.AbortClaimLost, why)
	}
}

// SourceEnded says the source ended on the replica core (err nil: done,
// its HandoffAck came back). What it sent last is the driver's to let
// out before the connection closes.
func (h *Holding) SourceEnded(now int64, err error) {
	switch h.state {
	case holdRunning, holdBroken, holdResuming, holdAborting:
	default:
		return
	}
	if err == nil {
		// Done, even with an abort on the way: the abort came too late to
		// matter, the destination went live with its digest.
		h.state, h.completing = holdFinishing, true
		h.ask(HoldAction{Kind: HoldComplete})
		return
	}
	h.finish(err)
}

// Stop says the node is stopping: the task is requeued at once (a running
// source aborted first) and nothing is retried.
func (h *Holding) Stop(now int64) {
	h.stopping = true
	switch h.state {
	case holdStarting:
		h.release(HoldStopped)
	case holdDialing:
		h.finish(errors.New("node stopping"))
	case holdStartingSource:
		h.ask(HoldAction{Kind: HoldClose})
		h.finish(errors.New("node stopping"))
	case holdRunning, holdBroken, holdResuming:
		h.ask(HoldAction{Kind: HoldAbortSource, Reason: wire.AbortInternal, Why: "node stopping"})
		h.ask(HoldAction{Kind: HoldClose})
		h.finish(errors.New("node stopping"))
	case holdAborting:
		h.finish(h.why)
	}
}

// Finished is the answer to HoldComplete and HoldRequeue.
func (h *Holding) Finished(now int64, err error) {
	if h.state != holdFinishing {
		return
	}
	switch {
	case h.completing:
		h.release(HoldCompleted)
	case h.stopping:
		h.release(HoldStopped)
	case errors.Is(err, claim.ErrTaskFinal):
		h.release(HoldFinal)
	default:
		h.release(HoldRequeued)
		h.ask(HoldAction{Kind: HoldRetry, At: now + h.cfg.RetryAfter})
	}
}

// abort asks the source's abort; the attempt finishes on its end.
func (h *Holding) abort(reason wire.AbortReason, why string) {
	h.state = holdAborting
	h.why = errors.New(why)
	h.ask(HoldAction{Kind: HoldAbortSource, Reason: reason, Why: why})
}

// giveUp aborts a source whose broken connection was not resumed, saying
// which rule gave it up.
func (h *Holding) giveUp(rule HoldGiveUp, why string) {
	h.abort(wire.AbortConnLost, why)
	h.out[len(h.out)-1].GaveUp = rule
}

// finish asks the requeue of a failed attempt.
func (h *Holding) finish(err error) {
	h.state, h.why = holdFinishing, err
	h.ask(HoldAction{Kind: HoldRequeue, Why: wire.ErrText(err)})
}

func (h *Holding) release(o HoldOutcome) {
	h.state, h.outcome = holdReleased, o
	h.ask(HoldAction{Kind: HoldRelease})
}
