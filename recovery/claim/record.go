package claim

import (
	"errors"
	"fmt"
	"time"
)

// Status is where a task stands (DESIGN.md step 1). The legal moves:
//
//	pending ── start ──────────────────► running
//	running ── start (takeover), touch ► running
//	running ── requeue, reset-stale ───► pending
//	running ── fail ───────────────────► failed
//	pending, running, failed ── done ──► done
//
// A completion is accepted from any status but done (DESIGN.md step 9: it is the
// same whoever produced it, even after the task was reset or given up).
// Done and failed are final for a generation of the task; CreateTask
// opens a new generation, which starts at pending.
type Status uint8

const (
	// StatusPending: waiting for an executor to claim and start it.
	StatusPending Status = iota + 1
	// StatusRunning: an attempt works it under the claim of Epoch.
	StatusRunning
	// StatusDone: an attempt completed it; final.
	StatusDone
	// StatusFailed: given up on; final.
	StatusFailed
)

var statusNames = [...]string{
	StatusPending: "pending",
	StatusRunning: "running",
	StatusDone:    "done",
	StatusFailed:  "failed",
}

func (s Status) String() string {
	if s >= StatusPending && s <= StatusFailed {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// MarshalText stores the status by name, so etcdctl shows it readably.
func (s Status) MarshalText() ([]byte, error) {
	if s < StatusPending || s > StatusFailed {
		return nil, fmt.Errorf("claim: cannot store %s", s)
	}
	return []byte(s.String()), nil
}

// UnmarshalText is the inverse of MarshalText.
func (s *Status) UnmarshalText(b []byte) error {
	for v := StatusPending; v <= StatusFailed; v++ {
		if string(b) == statusNames[v] {
			*s = v
			return nil
		}
	}
	return fmt.Errorf("claim: unknown task status %q", b)
}

// Final reports whether no attempt may change the status any more.
func (s Status) Final() bool { return s == StatusDone || s == StatusFailed }

// legalMoves is the table of the diagram above, by from and to.
var legalMoves = [...][StatusFailed + 1]bool{
	StatusPending: {StatusRunning: true, StatusDone: true},
	StatusRunning: {StatusPending: true, StatusRunning: true, StatusDone: true, StatusFailed: true},
	StatusDone:    {},
	StatusFailed:  {StatusDone: true},
}

// Errors of task records, classified with errors.Is.
var (
	// ErrNoTask: no record for the task.
	ErrNoTask = errors.New("claim: no such task")
	// ErrTaskOpen: CreateTask found the task pending or running.
	ErrTaskOpen = errors.New("claim: task already open")
	// ErrTaskFinal: the task is done or failed; nothing but a completion
	// (of a failed task) or a new generation changes it.
	ErrTaskFinal = errors.New("claim: task is final")
	// ErrNotHolder: the attempt does not hold the task's claim, or the
	// record is not running under its epoch: the attempt must stop.
	ErrNotHolder = errors.New("claim: attempt does not hold the task")
	// ErrStaleEpoch: the epoch is not newer than the task's generation or
	// current attempt: a superseded attempt.
	ErrStaleEpoch = errors.New("claim: stale epoch")
	// ErrDuplicate: the task was already done; the completion is ignored.
	ErrDuplicate = errors.New("claim: duplicate completion ignored")
)

// Record is what etcd keeps per task (DESIGN.md step 1), as JSON under RecordKey.
//
// Invariants: Executor and Epoch are set exactly when Status is running,
// done or failed, and then Epoch > Opened; Attempts counts starts in this
// generation, so it is >= 1 when running or failed.
type Record struct {
	Status Status `json:"status"`
	// Attempts counts the starts of this generation, takeovers included.
	Attempts uint32 `json:"attempts"`
	// Executor and Epoch are the attempt that runs the task, or that
	// completed or failed it.
	Executor string `json:"executor,omitempty"`
	Epoch    uint64 `json:"epoch,omitempty"`
	// UpdatedAt is when the record last changed, by the writer's clock; a
	// running attempt refreshes it (Touch) when it makes progress, so
	// ResetStale tells a slow but moving rejoin from a stuck one.
	UpdatedAt time.Time `json:"updated_at"`
	// Note says why the last move was made (a reset, a failure).
	Note string `json:"note,omitempty"`

	// Opened is the revision that created the record key: the generation.
	// Every claim made for this generation has a higher epoch, so an
	// attempt of an earlier generation is told apart. Kept by etcd, not in
	// the JSON.
	Opened uint64 `json:"-"`
	// ModRevision is the record key's revision when read, for the
	// compare-and-swap of the next write. Not in the JSON.
	ModRevision int64 `json:"-"`
}

// move sets the status, checking the edge: an illegal move is a bug in
// this package, not an operating error.
func (r *Record) move(to Status) {
	if r.Status < StatusPending || r.Status > StatusFailed || !legalMoves[r.Status][to] {
		panic(fmt.Sprintf("claim: illegal task move %s -> %s", r.Status, to))
	}
	r.Status = to
}

// The functions below are the whole logic of task records: each takes the
// record as read (with Opened and ModRevision) and returns the record to
// write, or the operating error that forbids it. The etcd side (tasks.go)
// only reads, calls one, and writes with a compare-and-swap; the simulator
// (recovery/sim) calls the same ones on its model of etcd, so its task
// record and its health task follow the product's rules.

// StartRecord moves a task to running for attempt a, which holds the claim
// (the write compares that). A running task is taken over only by a higher
// epoch: its attempt's claim is gone, since only one claim exists at a time.
// Starting again under the same epoch changes nothing (a retried request).
func StartRecord(r Record, a Attempt, now time.Time) (Record, bool, error) {
	switch {
	case r.Status.Final():
		return r, false, fmt.Errorf("%w: %s is %s", ErrTaskFinal, a.Task, r.Status)
	case a.Epoch <= r.Opened:
		return r, false, fmt.Errorf("%w: epoch %d is not after the task opened at %d", ErrStaleEpoch, a.Epoch, r.Opened)
	case r.Status == StatusRunning && a.Epoch == r.Epoch && a.Executor == r.Executor:
		return r, false, nil
	case r.Status == StatusRunning && a.Epoch <= r.Epoch:
		return r, false, fmt.Errorf("%w: epoch %d, task running at %d", ErrStaleEpoch, a.Epoch, r.Epoch)
	}
	r.move(StatusRunning)
	r.Attempts++
	r.Executor, r.Epoch, r.UpdatedAt, r.Note = a.Executor, a.Epoch, now, ""
	return r, true, nil
}

// TouchRecord refreshes UpdatedAt of the task attempt a runs.
func TouchRecord(r Record, a Attempt, now time.Time) (Record, error) {
	if err := checkRunning(r, a); err != nil {
		return r, err
	}
	r.move(StatusRunning)
	r.UpdatedAt = now
	return r, nil
}

// RequeueRecord puts the task attempt a runs back to pending, for another
// attempt (DESIGN.md step 8: a recovering side that gives up).
func RequeueRecord(r Record, a Attempt, note string, now time.Time) (Record, error) {
	if err := checkRunning(r, a); err != nil {
		return r, err
	}
	return toPending(r, note, now), nil
}

// FailRecord gives up the task attempt a runs: final for this generation.
func FailRecord(r Record, a Attempt, note string, now time.Time) (Record, error) {
	if err := checkRunning(r, a); err != nil {
		return r, err
	}
	r.move(StatusFailed)
	r.UpdatedAt, r.Note = now, note
	return r, nil
}

// DoneRecord accepts attempt a's completion, whoever a is, as long as it
// belongs to this generation (DESIGN.md step 9). A second completion is
// ErrDuplicate, with the record unchanged.
func DoneRecord(r Record, a Attempt, now time.Time) (Record, error) {
	switch {
	case a.Epoch <= r.Opened:
		return r, fmt.Errorf("%w: completion of epoch %d is of a generation before %d", ErrStaleEpoch, a.Epoch, r.Opened)
	case r.Status == StatusDone:
		return r, fmt.Errorf("%w: %s already done by %s at epoch %d", ErrDuplicate, a.Task, r.Executor, r.Epoch)
	}
	r.move(StatusDone)
	r.Executor, r.Epoch, r.UpdatedAt, r.Note = a.Executor, a.Epoch, now, ""
	return r, nil
}

// StaleReason reports why a running task must go back to pending, or ""
// (DESIGN.md steps 1 and 10): its attempt's claim is gone
// (claimEpoch, the claim key's CreateRevision or 0, is not its epoch), or
// it has not been refreshed for staleAfter.
func StaleReason(r Record, claimEpoch uint64, now time.Time, staleAfter time.Duration) string {
	switch {
	case r.Status != StatusRunning:
		return ""
	case claimEpoch == 0:
		return fmt.Sprintf("claim of epoch %d gone", r.Epoch)
	case claimEpoch != r.Epoch:
		return fmt.Sprintf("claim of epoch %d replaced by epoch %d", r.Epoch, claimEpoch)
	case now.Sub(r.UpdatedAt) > staleAfter:
		return fmt.Sprintf("not updated for %s (> %s)", now.Sub(r.UpdatedAt), staleAfter)
	}
	return ""
}

// ResetRecord puts a stale running task back to pending.
func ResetRecord(r Record, why string, now time.Time) Record {
	return toPending(r, "reset: "+why, now)
}

func toPending(r Record, note string, now time.Time) Record {
	r.move(StatusPending)
	r.Executor, r.Epoch, r.UpdatedAt, r.Note = "", 0, now, note
	return r
}

func checkRunning(r Record, a Attempt) error {
	switch {
	case r.Status.Final():
		return fmt.Errorf("%w: %s is %s", ErrTaskFinal, a.Task, r.Status)
	case r.Status != StatusRunning || r.Epoch != a.Epoch || r.Executor != a.Executor:
		return fmt.Errorf("%w: %s is %s under epoch %d, attempt has %d", ErrNotHolder, a.Task, r.Status, r.Epoch, a.Epoch)
	}
	return nil
}
