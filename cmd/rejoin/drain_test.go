package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// TestMoveCommandFlags: drain and rebalance refuse bad flags and
// arguments as usage errors (exit 2), naming what is wrong.
func TestMoveCommandFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"drain", "--etcd", "x"}, "want one NODE argument, got 0 arguments"},
		{[]string{"drain", "--etcd", "x", "n1", "n2"}, "want one NODE argument, got 2 arguments"},
		// Flags after the node are flags: they were taken for arguments.
		{[]string{"drain", "n1", "--etcd", "x", "--moves-max", "0"}, "--moves-max 0: want 1 or more"},
		{[]string{"drain", "--etcd", "x", "nope"}, `"nope" is not a node id`},
		{[]string{"drain", "--etcd", "x", "--moves-max", "0", "n1"}, "--moves-max 0: want 1 or more"},
		{[]string{"drain", "--etcd", "x", "--incoming-max", "-1", "n1"}, "--incoming-max -1: want 1 or more"},
		{[]string{"drain", "--etcd", "x", "--timeout", "0s", "n1"}, "--timeout 0s"},
		{[]string{"drain", "--bogus", "n1"}, "flag provided but not defined: -bogus"},
		{[]string{"drain", "n1"}, "--etcd is required"},
		{[]string{"rebalance", "--etcd", "x", "n1"}, `unexpected argument "n1"`},
		{[]string{"rebalance", "--etcd", "x", "--poll", "0s"}, "--poll 0s: want more than 0"},
		{[]string{"rebalance"}, "--etcd is required"},
		{[]string{"undo-move", "--etcd", "x"}, "want one PARTITION argument, got 0 arguments"},
		{[]string{"undo-move", "1", "--etcd", "x", "--timeout", "0s"}, "--timeout 0s: want more than 0"},
		{[]string{"undo-move", "--etcd", "x", "p1"}, `"p1" is not a partition number`},
		{[]string{"undo-move", "--etcd", "x", "--timeout", "0s", "1"}, "--timeout 0s: want more than 0"},
		{[]string{"undo-move", "1"}, "--etcd is required"},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("run(%q): exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// TestMoveCommands: against an embedded etcd with registered nodes (no
// node process: the test marks the new replicas live as a node would once
// rebuilt), drain refuses a node whose replicas no other node can take,
// rebalance says a balanced cluster is done, and with a node added it
// moves its share onto it, printing each move, and ends balanced with no
// move left.
func TestMoveCommands(t *testing.T) {
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	ep := strings.Join(e.Endpoints(), ",")
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := layout.Init(ctx, cli, layout.Config{Partitions: 4, Replicas: 2, Tables: []layout.Table{layout.KV()}}, []string{"n1", "n2"}); err != nil {
		t.Fatal(err)
	}
	register := func(id string) {
		now := time.Now()
		if _, err := supervise.Incarnate(ctx, cli, id, []string{"n1", "n2"}, now); err != nil {
			t.Fatal(err)
		}
		n, err := supervise.Register(ctx, cli, id, supervise.NodeOptions{TTL: 5 * time.Second, Started: now, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = n.Close(cctx)
		})
		if err := supervise.MarkRegistered(ctx, cli, id); err != nil {
			t.Fatal(err)
		}
	}
	register("n1")
	register("n2")

	var out, errOut bytes.Buffer
	if code := run([]string{"drain", "--etcd", ep, "n2"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "rejoin drain: no running node can take partition 0 off n2") {
		t.Fatalf("drain with no room: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"rebalance", "--etcd", ep}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "done: 0 moves") {
		t.Fatalf("rebalance when balanced: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}

	register("n3")
	// A move onto n3 taken back by hand before n3 rebuilt its replica.
	v, err := supervise.ReadMoves(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	if err := supervise.StartMove(ctx, cli, v, supervise.Move{Partition: 1, From: v.Replicas[1][0].Node, To: "n3"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"undo-move", "--etcd", ep, "1"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "undone   partition 1") {
		t.Fatalf("undo-move: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	if v, err = supervise.ReadMoves(ctx, cli); err != nil || len(v.Moves) != 0 || len(v.Replicas[1]) != 2 {
		t.Fatalf("after undo-move: moves %v, replicas of 1 %v, %v", v.Moves, v.Replicas[1], err)
	}
	errOut.Reset()
	if code := run([]string{"undo-move", "--etcd", ep, "1"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "rejoin undo-move: partition 1: no move under way") {
		t.Fatalf("undo-move with none under way: exit %d, stderr %q", code, errOut.String())
	}
	// A move whose new holder never opens its rejoin task (no node
	// process runs here): the command says what it waits for, a timeout
	// names the move, not etcd, and past --stall the move is undone.
	if v, err = supervise.ReadMoves(ctx, cli); err != nil {
		t.Fatal(err)
	}
	if err := supervise.StartMove(ctx, cli, v, supervise.Move{Partition: 1, From: v.Replicas[1][0].Node, To: "n3"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	code := run([]string{"rebalance", "--etcd", ep, "--poll", "50ms", "--timeout", "1500ms"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "--timeout 1.5s passed") || strings.Contains(errOut.String(), "did not answer") ||
		!strings.Contains(errOut.String(), "partition 1 n") || !strings.Contains(errOut.String(), "no rejoin task onto it is open yet") {
		t.Fatalf("rebalance timing out on a move that waits: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	t.Logf("rebalance, timed out:\n%s%s", out.String(), errOut.String())
	if !strings.Contains(out.String(), "waiting  partition 1 ") {
		t.Fatalf("rebalance waited without saying for what: stdout %q", out.String())
	}
	out.Reset()
	errOut.Reset()
	code = run([]string{"rebalance", "--etcd", ep, "--poll", "50ms", "--stall", "1s", "--say-every", "200ms", "--timeout", "30s"}, &out, &errOut)
	if code != 1 || !strings.Contains(out.String(), "undone   partition 1 ") || !strings.Contains(errOut.String(), "never asked for the rejoin") {
		t.Fatalf("rebalance on a move that stalls: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	t.Logf("rebalance, stalled:\n%s%s", out.String(), errOut.String())
	if got := strings.Count(out.String(), "waiting  partition 1 "); got < 3 {
		t.Fatalf("an unchanged wait of 1 s said %d times with --say-every 200ms: %q", got, out.String())
	}
	if v, err = supervise.ReadMoves(ctx, cli); err != nil || len(v.Moves) != 0 || len(v.Replicas[1]) != 2 {
		t.Fatalf("after the stalled move was undone: moves %v, replicas of 1 %v, %v", v.Moves, v.Replicas[1], err)
	}
	// n3's stand-in: it marks each replica moved onto it live.
	fake, stopFake := context.WithCancel(ctx)
	defer stopFake()
	go func() {
		for fake.Err() == nil {
			reps, err := supervise.Replicas(fake, cli)
			if err == nil {
				for _, r := range reps {
					if r.Node == "n3" && r.State != recovery.ReplicaLive {
						_ = supervise.UpdateReplica(fake, cli, supervise.Replica{Partition: r.Partition, Node: "n3", State: recovery.ReplicaLive})
					}
				}
			}
			select {
			case <-time.After(50 * time.Millisecond):
			case <-fake.Done():
			}
		}
	}()
	out.Reset()
	errOut.Reset()
	if code := run([]string{"rebalance", "--etcd", ep, "--poll", "50ms", "--timeout", "30s"}, &out, &errOut); code != 0 {
		t.Fatalf("rebalance onto n3: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	// 8 replicas on n1 and n2 (4 each): n3 takes two, leaving 3,3,2.
	if got := strings.Count(out.String(), "moving   partition"); got != 2 || !strings.Contains(out.String(), "done: 2 moves") {
		t.Fatalf("rebalance onto n3 printed %d moves: %q", got, out.String())
	}
	v, err = supervise.ReadMoves(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, reps := range v.Replicas {
		for _, r := range reps {
			count[r.Node]++
		}
	}
	if len(v.Moves) != 0 || count["n3"] != 2 || count["n1"]+count["n2"] != 6 {
		t.Fatalf("after rebalance: moves %v, counts %v", v.Moves, count)
	}
}
