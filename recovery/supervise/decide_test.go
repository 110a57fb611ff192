package supervise

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

var testLimits = Limits{PassActionsMax: 16, ClaimWithin: 10 * time.Second}

// cluster builds a snapshot: nodes n1..n4 alive, partition 1 live on n1,
// n2, n4 and needing a rejoin on n3; one pending task 1->n3 of generation
// 100.
func cluster() Snapshot {
	s := Snapshot{
		Nodes:       map[string]NodeRecord{},
		Replicas:    map[uint32][]Replica{},
		Claims:      map[claim.Task]uint64{},
		Assignments: map[claim.Task]Assignment{},
	}
	for _, id := range []string{"n1", "n2", "n3", "n4"} {
		s.Nodes[id] = NodeRecord{ID: id, Status: NodeReady, LastActive: t0}
	}
	s.Replicas[1] = []Replica{
		{Partition: 1, Node: "n1", State: recovery.ReplicaLive},
		{Partition: 1, Node: "n2", State: recovery.ReplicaLive},
		{Partition: 1, Node: "n3", State: recovery.ReplicaNeedsRejoin},
		{Partition: 1, Node: "n4", State: recovery.ReplicaLive},
	}
	s.Tasks = []claim.TaskRecord{{Task: task13, Record: claim.Record{Status: claim.StatusPending, Opened: 100}}}
	return s
}

var task13 = claim.Task{Partition: 1, Dest: "n3"}

// show renders actions one per line, for comparison.
func show(as []Action) string {
	var b strings.Builder
	for _, a := range as {
		fmt.Fprintf(&b, "%s %s", a.Kind, a.Task)
		if a.Kind == ActAssign {
			fmt.Fprintf(&b, " src=%s seq=%d prev=%d revoke=%d declined=%v", a.Assignment.Source, a.Assignment.Seq, a.PrevModRevision, a.RevokeEpoch, a.Assignment.Declined)
		} else if a.RevokeEpoch != 0 {
			fmt.Fprintf(&b, " revoke=%d", a.RevokeEpoch)
		}
		fmt.Fprintf(&b, " (%s)\n", a.Reason)
	}
	return b.String()
}

func TestDecide(t *testing.T) {
	assigned := func(src string, seq uint32, at time.Time, declined ...string) Assignment {
		return Assignment{Task: task13, Source: src, Seq: seq, Opened: 100, AssignedAt: at, Declined: declined, ModRevision: 7}
	}
	running := func(s *Snapshot, epoch uint64) {
		s.Tasks[0].Record = claim.Record{Status: claim.StatusRunning, Opened: 100, Epoch: epoch, Executor: "x", Attempts: 1}
	}
	cases := []struct {
		name  string
		setup func(s *Snapshot)
		now   time.Time
		want  string
	}{
		{"unassigned picks the first by id", func(s *Snapshot) {}, t0,
			"assign 1->n3 src=n1 seq=1 prev=0 revoke=0 declined=[] (unassigned)\n"},
		{"kept while under way", func(s *Snapshot) {
			s.Assignments[task13] = assigned("n1", 1, t0)
			running(s, 150)
			s.Claims[task13] = 150
		}, t0.Add(time.Hour), ""},
		{"destination dead: attempt ended, claim revoked, no new source", func(s *Snapshot) {
			s.Assignments[task13] = assigned("n1", 1, t0)
			running(s, 150)
			s.Claims[task13] = 150
			delete(s.Nodes, "n3")
		}, t0.Add(time.Second), "unassign 1->n3 revoke=150 (destination n3 dead (no lease))\n"},
		{"destination dead and nothing assigned: wait", func(s *Snapshot) { delete(s.Nodes, "n3") }, t0, ""},
		{"kept while within ClaimWithin", func(s *Snapshot) { s.Assignments[task13] = assigned("n1", 1, t0) }, t0.Add(5 * time.Second), ""},
		{"not claimed in time goes elsewhere", func(s *Snapshot) { s.Assignments[task13] = assigned("n1", 1, t0) }, t0.Add(11 * time.Second),
			"assign 1->n3 src=n2 seq=2 prev=7 revoke=0 declined=[] (not claimed within 10s)\n"},
		{"source dead: new attempt, old claim revoked", func(s *Snapshot) {
			s.Assignments[task13] = assigned("n1", 1, t0)
			running(s, 150)
			s.Claims[task13] = 150
			delete(s.Nodes, "n1")
		}, t0, "assign 1->n3 src=n2 seq=2 prev=7 revoke=150 declined=[] (source n1 dead (no lease))\n"},
		{"claim lost while running", func(s *Snapshot) {
			s.Assignments[task13] = assigned("n1", 1, t0)
			running(s, 150)
		}, t0, "assign 1->n3 src=n2 seq=2 prev=7 revoke=0 declined=[] (claim of epoch 150 gone)\n"},
		{"declined goes elsewhere and remembers", func(s *Snapshot) {
			s.Assignments[task13] = assigned("n1", 1, t0, "n1")
		}, t0, "assign 1->n3 src=n2 seq=2 prev=7 revoke=0 declined=[n1] (declined by n1)\n"},
		{"declined by all: no source within ClaimWithin", func(s *Snapshot) {
			s.Assignments[task13] = assigned("n4", 3, t0, "n1", "n2", "n4")
		}, t0, "no-source 1->n3 (declined by n4)\n"},
		{"over its limit a source is skipped", func(s *Snapshot) {
			n := s.Nodes["n1"]
			n.OutgoingMax = 1
			s.Nodes["n1"] = n
			other := claim.Task{Partition: 1, Dest: "n9"}
			s.Nodes["n9"] = NodeRecord{ID: "n9", Status: NodeReady, LastActive: t0}
			s.Tasks = append([]claim.TaskRecord{{Task: other, Record: claim.Record{Status: claim.StatusPending, Opened: 90}}}, s.Tasks...)
			s.Assignments[other] = Assignment{Task: other, Source: "n1", Seq: 1, Opened: 90, AssignedAt: t0}
		}, t0, "assign 1->n3 src=n2 seq=1 prev=0 revoke=0 declined=[] (unassigned)\n"},
		{"not-responding and needs-rejoin and the destination are never sources", func(s *Snapshot) {
			n := s.Nodes["n1"]
			n.Status = NodeNotResponding
			s.Nodes["n1"] = n
			delete(s.Nodes, "n2")
			s.Replicas[1][2].State = recovery.ReplicaLive // the destination itself
		}, t0, "assign 1->n3 src=n4 seq=1 prev=0 revoke=0 declined=[] (unassigned)\n"},
		{"done: assignment deleted", func(s *Snapshot) {
			s.Assignments[task13] = assigned("n1", 1, t0)
			s.Tasks[0].Status = claim.StatusDone
		}, t0, "unassign 1->n3 (task done)\n"},
		{"assignment without a task record deleted", func(s *Snapshot) {
			s.Tasks = nil
			s.Assignments[task13] = assigned("n1", 1, t0)
		}, t0, "unassign 1->n3 (no task record)\n"},
		{"older generation's assignment replaced", func(s *Snapshot) {
			a := assigned("n1", 4, t0)
			a.Opened = 50
			s.Assignments[task13] = a
		}, t0, "assign 1->n3 src=n1 seq=1 prev=7 revoke=0 declined=[] (new generation)\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := cluster()
			c.setup(&s)
			if got := show(Decide(s, c.now, testLimits)); got != c.want {
				t.Errorf("got\n%swant\n%s", got, c.want)
			}
		})
	}
}

// TestDecideBounded: a pass writes at most PassActionsMax, and spreads
// tasks over sources by load.
func TestDecideBounded(t *testing.T) {
	s := cluster()
	s.Tasks = nil
	for p := range uint32(10) {
		task := claim.Task{Partition: 1, Dest: fmt.Sprintf("d%d", p)}
		s.Nodes[task.Dest] = NodeRecord{ID: task.Dest, Status: NodeReady, LastActive: t0}
		s.Tasks = append(s.Tasks, claim.TaskRecord{Task: task, Record: claim.Record{Status: claim.StatusPending, Opened: 100}})
	}
	lim := testLimits
	lim.PassActionsMax = 4
	got := Decide(s, t0, lim)
	if len(got) != 4 {
		t.Fatalf("%d actions, want 4:\n%s", len(got), show(got))
	}
	perSource := map[string]int{}
	for _, a := range Decide(s, t0, Limits{PassActionsMax: 100}) {
		perSource[a.Assignment.Source]++
	}
	// Three sources, OutgoingMaxDefault each: six assigned, four wait.
	if perSource["n1"] != 2 || perSource["n2"] != 2 || perSource["n4"] != 2 || perSource[""] != 4 {
		t.Fatalf("per source %v", perSource)
	}
}

func TestCheckHealth(t *testing.T) {
	lim := HealthLimits{NotRespondingAfter: 3 * time.Second, RemoveAfter: 24 * time.Hour}
	nodes := []NodeRecord{
		{ID: "fresh", Status: NodeReady, LastActive: t0.Add(-time.Second)},
		{ID: "silent", Status: NodeReady, LastActive: t0.Add(-4 * time.Second)},
		{ID: "marked", Status: NodeNotResponding, LastActive: t0.Add(-time.Hour)},
		{ID: "ancient", Status: NodeNotResponding, LastActive: t0.Add(-25 * time.Hour)},
	}
	var got []string
	for _, a := range CheckHealth(nodes, t0, lim) {
		got = append(got, a.String())
	}
	want := []string{"remove ancient: last active 25h0m0s ago (> 24h0m0s)", "mark-not-responding silent: last active 4s ago (> 3s)"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}
