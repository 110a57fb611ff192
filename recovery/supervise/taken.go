package supervise

import "github.com/rejoin-db/rejoin/recovery/claim"

// Taken is what a source's executor has taken of its assignments: per
// task, the generation (Assignment.Opened) and Seq of the newest one. An
// assignment is new if it is of a later generation, or of the same one
// with a higher Seq. Seq counts from 1 again in every generation, so Seq
// alone is not enough: a source that had taken seq 3 of a task ignored
// seq 1 to 3 of the task's next generation, 10 s each (ClaimWithin),
// and a partition whose one live replica it held waited past the two
// minutes rejoin chaos allows (seed 31337, 10 minutes).
type Taken map[claim.Task]TakenAt

// TakenAt is the generation and Seq of the assignment last taken.
type TakenAt struct {
	Opened uint64
	Seq    uint32
}

// Take reports whether a is newer than what was taken of its task, and
// if so records it as taken.
func (t Taken) Take(a Assignment) bool {
	if h, ok := t[a.Task]; ok && (a.Opened < h.Opened || a.Opened == h.Opened && a.Seq <= h.Seq) {
		return false
	}
	t[a.Task] = TakenAt{Opened: a.Opened, Seq: a.Seq}
	return true
}

// Retry forgets task: its standing assignment is taken again (a failed
// attempt was requeued, and a new claim, at a higher epoch, follows).
func (t Taken) Retry(task claim.Task) { delete(t, task) }
