package supervise

import (
	"testing"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// TestTakenGenerations: an executor takes each assignment once, a later
// Seq of the same generation, every Seq of a later generation (Seq counts
// from 1 again), nothing of an older generation, and the same assignment
// again after a retry.
func TestTakenGenerations(t *testing.T) {
	task := claim.Task{Partition: 7, Dest: "n3"}
	other := claim.Task{Partition: 7, Dest: "n4"}
	taken := Taken{}
	for i, step := range []struct {
		a     Assignment
		retry bool
		want  bool
	}{
		{a: Assignment{Task: task, Opened: 100, Seq: 1}, want: true},
		{a: Assignment{Task: task, Opened: 100, Seq: 1}, want: false},
		{a: Assignment{Task: task, Opened: 100, Seq: 3}, want: true},
		{a: Assignment{Task: task, Opened: 100, Seq: 2}, want: false},
		{a: Assignment{Task: other, Opened: 90, Seq: 1}, want: true},
		// The task done, the destination failed again: a new generation.
		{a: Assignment{Task: task, Opened: 250, Seq: 1}, want: true},
		{a: Assignment{Task: task, Opened: 100, Seq: 4}, want: false},
		{a: Assignment{Task: task, Opened: 250, Seq: 1}, retry: true, want: true},
	} {
		if step.retry {
			taken.Retry(step.a.Task)
		}
		if got := taken.Take(step.a); got != step.want {
			t.Fatalf("step %d: Take(%s opened %d seq %d) = %v, want %v", i, step.a.Task, step.a.Opened, step.a.Seq, got, step.want)
		}
	}
}
