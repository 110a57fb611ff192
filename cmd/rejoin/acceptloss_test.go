package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

func TestAcceptLossFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"accept-loss", "--etcd", "x"}, "want one PARTITION argument, got 0 arguments"},
		{[]string{"accept-loss", "--etcd", "x", "p1"}, `"p1" is not a partition number`},
		{[]string{"accept-loss", "--etcd", "x", "--timeout", "0s", "1"}, "--timeout 0s: want more than 0"},
		{[]string{"accept-loss", "--etcd", "x", "--wait", "-1s", "1"}, "--wait -1s: want 0 or more"},
		{[]string{"accept-loss", "--etcd", "x", "--node", "nope", "1"}, `--node "nope" is not a node id`},
		{[]string{"accept-loss", "1"}, "--etcd is required"},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("run(%q): exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// TestAcceptLossCommand: against an embedded etcd (no node process),
// accept-loss refuses a partition with nothing held and one held on two
// nodes without --node, then records the loss of the one named; with
// --wait it reports a replica its node never made live.
func TestAcceptLossCommand(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const why = "registration lapsed, and [n1] sequenced txns of partition 1 without a feed here meanwhile"
	if err := supervise.SetReplicas(ctx, cli, []supervise.Replica{
		{Partition: 0, Node: "n1", State: recovery.ReplicaNeedsRejoin},
		{Partition: 1, Node: "n2", State: recovery.ReplicaNeedsRejoin, Held: why},
		{Partition: 1, Node: "n3", State: recovery.ReplicaNeedsRejoin, Held: why},
	}); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"accept-loss", "--etcd", ep, "0"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "partition 0 has no held replica") {
		t.Fatalf("nothing held: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"accept-loss", "--etcd", ep, "1"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "held replicas on n2, n3") {
		t.Fatalf("two held: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"accept-loss", "--etcd", ep, "--node", "3", "--wait", "300ms", "1"}, &out, &errOut); code != 1 ||
		!strings.Contains(out.String(), "accepted partition 1 on n3: the loss of what it missed ("+why+") is recorded") ||
		!strings.Contains(errOut.String(), "not live 300ms after the loss was accepted: is n3 running?") {
		t.Fatalf("accepted: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	losses, err := supervise.Losses(ctx, cli)
	if err != nil || len(losses) != 1 || losses[0].Node != "n3" || losses[0].Held != why {
		t.Fatalf("losses %+v, %v", losses, err)
	}
}
