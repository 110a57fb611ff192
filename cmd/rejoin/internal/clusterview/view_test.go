package clusterview

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/wire"
)

var t0 = time.Date(2026, 11, 22, 13, 0, 0, 0, time.UTC)

// canned: n1, n2 live; n3 restarted and rejoining partition 1 from n2,
// held; n4 dead.
func canned() (supervise.Snapshot, map[string]node.Status, map[string]error) {
	nodes := map[string]supervise.NodeRecord{}
	for _, id := range []string{"n1", "n2", "n3", "n10"} {
		nodes[id] = supervise.NodeRecord{ID: id, Address: "127.0.0.1:1" + id[1:], HTTP: "127.0.0.1:2" + id[1:],
			Status: supervise.NodeReady, Started: t0, LastActive: t0.Add(9 * time.Second)}
	}
	task := claim.Task{Partition: 1, Dest: "n3"}
	snap := supervise.Snapshot{
		Nodes: nodes,
		Replicas: map[uint32][]supervise.Replica{
			0: {{Partition: 0, Node: "n1", State: recovery.ReplicaLive}, {Partition: 0, Node: "n4", State: recovery.ReplicaLive}},
			1: {{Partition: 1, Node: "n3", State: recovery.ReplicaNeedsRejoin}, {Partition: 1, Node: "n2", State: recovery.ReplicaLive}},
		},
		Tasks:       []claim.TaskRecord{{Task: task, Record: claim.Record{Status: claim.StatusRunning, Attempts: 2, Epoch: 77}}},
		Assignments: map[claim.Task]supervise.Assignment{task: {Task: task, Source: "n2", Seq: 2}},
	}
	statuses := map[string]node.Status{
		"n1": {Node: "n1", Replicas: []node.ReplicaStatus{{Partition: 0, State: recovery.ReplicaLive, Rows: 500, Digest: 0xabc, LastExecuted: 1 << 22}}},
		"n2": {Node: "n2", Replicas: []node.ReplicaStatus{{Partition: 1, State: recovery.ReplicaLive, Rows: 1000, Digest: 0xdef,
			Sources: []node.RejoinStatus{{Role: "source", Peer: "n3", Epoch: 77, Phase: "streaming", Rows: 400, Bytes: 48000, Held: true}}}}},
		"n3": {Node: "n3", Replicas: []node.ReplicaStatus{{Partition: 1, State: recovery.ReplicaRejoining,
			Rejoin: &node.RejoinStatus{Role: "destination", Peer: "n2", Epoch: 77, Phase: "snapshot", Rows: 250, Bytes: 30000_000}}}},
	}
	return snap, statuses, map[string]error{"n10": errors.New("connection refused")}
}

func TestBuild(t *testing.T) {
	snap, st, errs := canned()
	v := Build(snap, st, errs, t0.Add(10*time.Second))
	var ids []string
	for _, n := range v.Nodes {
		ids = append(ids, n.ID)
	}
	if strings.Join(ids, " ") != "n1 n2 n3 n10" {
		t.Fatalf("nodes in order %v", ids)
	}
	if len(v.Replicas) != 4 {
		t.Fatalf("replicas %+v", v.Replicas)
	}
	dead := v.Replicas[1]
	if dead.Node != "n4" || dead.Alive || dead.Reported {
		t.Fatalf("n4's replica %+v", dead)
	}
	if len(v.Down) != 1 || v.Down[0] != (DownRow{ID: "n4", Replicas: 1}) {
		t.Fatalf("down nodes %+v, want n4 with its one replica", v.Down)
	}
	if r := v.Replicas[0]; !r.Reported || r.Rows != 500 || r.State != recovery.ReplicaLive {
		t.Fatalf("n1's replica %+v", r)
	}
	if len(v.Tasks) != 1 {
		t.Fatalf("tasks %+v", v.Tasks)
	}
	tr := v.Tasks[0]
	if tr.Source != "n2" || tr.Phase != "snapshot" || tr.Rows != 250 || tr.SourceRows != 1000 || !tr.Held || tr.Epoch != 77 || tr.Attempts != 2 {
		t.Fatalf("task %+v", tr)
	}
	if p := tr.Progress(); p != 25 {
		t.Fatalf("progress %v", p)
	}
}

func TestRender(t *testing.T) {
	snap, st, errs := canned()
	var b bytes.Buffer
	if err := Render(&b, Build(snap, st, errs, t0.Add(10*time.Second))); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"NODES (4 registered, 1 down)",
		"n4   -              -              DOWN (not registered; holds 1 replicas)",
		"n10  127.0.0.1:110",
		"ready (no /status: connection refused)",
		"1s ago",
		"0          n4    live          failed (node down)",
		"0000000000000abc",
		"t1.c0.i0",
		"REJOIN TASKS (1)",
		"snapshot (held)",
		"30.0",
		"25%",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
	// Columns line up: the header's ROWS starts where the task's rows do.
	lines := strings.Split(out, "\n")
	hdr, row := lines[len(lines)-3], lines[len(lines)-2]
	if i := strings.Index(hdr, "ROWS"); i < 0 || !strings.HasPrefix(row[i:], "250 ") {
		t.Errorf("task table not aligned:\n%s\n%s", hdr, row)
	}
}

// TestRenderMoves: a move under way shows in a MOVES table of its own,
// with the new replica's state; without one there is no such table.
func TestRenderMoves(t *testing.T) {
	snap, st, errs := canned()
	v := Build(snap, st, errs, t0.Add(10*time.Second))
	var b bytes.Buffer
	if err := Render(&b, v); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "MOVES") {
		t.Fatalf("a MOVES table with no move:\n%s", b.String())
	}
	v.Moves = []MoveRow{{Partition: 1, From: "n4", To: "n3", Started: t0.Add(5 * time.Second), ToState: "needs-rejoin"}}
	b.Reset()
	if err := Render(&b, v); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MOVES (1 under way", "PARTITION  FROM  TO  NEW REPLICA   STARTED", "1          n4    n3  needs-rejoin  5s ago"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("render lacks %q:\n%s", want, b.String())
		}
	}
}

// TestRenderHeld: a held replica shows in its row and in a HELD table
// with its reason and the way out, an accepted loss in a LOSSES table;
// with neither there are no such tables.
func TestRenderHeld(t *testing.T) {
	snap, st, errs := canned()
	var b bytes.Buffer
	if err := Render(&b, Build(snap, st, errs, t0.Add(10*time.Second))); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "HELD") || strings.Contains(b.String(), "LOSSES") {
		t.Fatalf("a HELD or LOSSES table with none:\n%s", b.String())
	}
	const why = "registration lapsed, and [n3] sequenced txns of partition 0 without a feed here meanwhile"
	snap.Replicas[0][0].State, snap.Replicas[0][0].Held = recovery.ReplicaNeedsRejoin, why
	st["n1"].Replicas[0].State = recovery.ReplicaHeld
	v := Build(snap, st, errs, t0.Add(10*time.Second))
	v.Losses = []supervise.Loss{{Partition: 1, Node: "n2", Held: "the feeds of [n5] did not stay open", At: t0}}
	b.Reset()
	if err := Render(&b, v); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"0          n1    needs-rejoin  held",
		"HELD (1: no other replica live",
		"rejoin accept-loss PARTITION",
		"0          n1    " + why,
		"LOSSES (1 accepted",
		"1          n2    2026-11-22T13:00:00Z  the feeds of [n5] did not stay open",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("render lacks %q:\n%s", want, b.String())
		}
	}
}

func digestOut(d uint64, rows int64) []wire.Value {
	return []wire.Value{wire.Int64(int64(d)), wire.Int64(rows)}
}

func TestEvaluateDigests(t *testing.T) {
	answers := map[uint32]Answer{
		0: {ID: 5, Each: []client.ReplicaResult{{Node: "n2", Out: digestOut(7, 10)}, {Node: "n1", Out: digestOut(7, 10)}}},
		1: {ID: 6, Each: []client.ReplicaResult{{Node: "n1", Out: digestOut(7, 10)}, {Node: "n3", Out: digestOut(8, 10)}}},
		2: {ID: 7, Each: []client.ReplicaResult{{Node: "n1", Out: digestOut(7, 10)}}},
		3: {Err: errors.New("no node")},
		4: {ID: 9, Each: []client.ReplicaResult{{Node: "n1", Out: digestOut(1, 1)}, {Node: "n2", Err: "replica not live"}}},
	}
	live := map[uint32]int{0: 2, 1: 2, 2: 2, 3: 2, 4: 2}
	rep := EvaluateDigests(6, answers, live)
	if got := rep.Bad; len(got) != 5 || got[0] != 1 || got[4] != 5 {
		t.Fatalf("bad %v", got)
	}
	if rep.OK() || !rep.Differ() {
		t.Fatal("OK with mismatches")
	}
	for p, differ := range []bool{false, true, false, false, false, false} {
		if rep.Partitions[p].Differ != differ {
			t.Errorf("partition %d differ %v", p, !differ)
		}
	}
	if !rep.Partitions[0].Match || rep.Partitions[0].Replicas[0].Node != "n1" || rep.Partitions[0].TxnID != 5 {
		t.Fatalf("partition 0 %+v", rep.Partitions[0])
	}
	if rep.ReplicasChecked != 6 {
		t.Fatalf("checked %d", rep.ReplicasChecked)
	}
	for p, want := range map[int]string{1: "n1 has 0000000000000007 over 10 rows, n3 has 0000000000000008", 2: "1 answers, 2 live replicas",
		3: "no node", 4: "n2: replica not live", 5: "not asked"} {
		if !strings.Contains(rep.Partitions[p].Problem, want) {
			t.Errorf("partition %d problem %q, want %q", p, rep.Partitions[p].Problem, want)
		}
	}
	var b bytes.Buffer
	if err := RenderDigests(&b, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "MISMATCH") || !strings.Contains(b.String(), "match") {
		t.Fatalf("render:\n%s", b.String())
	}
	ok := EvaluateDigests(1, map[uint32]Answer{0: answers[0]}, map[uint32]int{0: 2})
	if !ok.OK() || len(ok.Bad) != 0 || ok.Differ() {
		t.Fatalf("all-match report %+v", ok)
	}
}
