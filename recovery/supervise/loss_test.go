package supervise

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
)

// TestAcceptLoss: an admin makes a held replica live again only while no
// replica of its partition is live, names the node when several are held,
// and the record and the loss record say so in one write; a record held
// and live, or a loss accepted for a replica not held, is refused as no
// writer stores it.
func TestAcceptLoss(t *testing.T) {
	checkLeaks(t)
	cli := newClient(t, startEtcd(t))
	ctx := testCtx(t, 30*time.Second)
	at := time.Date(2026, 12, 3, 21, 0, 0, 0, time.UTC)
	const why = "registration lapsed, and [n1] sequenced txns of partition 0 without a feed here meanwhile"
	if _, err := cli.Put(ctx, NodeKey("n3"), `{"address":"127.0.0.1:1"}`); err != nil {
		t.Fatal(err)
	}
	if err := SetReplicas(ctx, cli, []Replica{
		{Partition: 0, Node: "n1", State: recovery.ReplicaNeedsRejoin},
		{Partition: 0, Node: "n2", State: recovery.ReplicaNeedsRejoin, Held: why},
		{Partition: 0, Node: "n3", State: recovery.ReplicaNeedsRejoin, Held: why},
		{Partition: 1, Node: "n2", State: recovery.ReplicaNeedsRejoin, Held: why},
		{Partition: 1, Node: "n3", State: recovery.ReplicaLive},
		{Partition: 2, Node: "n2", State: recovery.ReplicaNeedsRejoin},
		// Live on a node not registered: held on n2 all the same.
		{Partition: 4, Node: "n1", State: recovery.ReplicaLive},
		{Partition: 4, Node: "n2", State: recovery.ReplicaNeedsRejoin, Held: why},
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p    uint32
		node string
		want string
	}{
		{0, "", "held replicas on n2, n3"},
		{0, "n1", "no held replica on n1"},
		{1, "", "live replica on n3"},
		{2, "", "no held replica"},
	} {
		if _, err := AcceptLoss(ctx, cli, c.p, c.node, at); !errors.Is(err, ErrNotHeld) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("partition %d, node %q: %v, want %q", c.p, c.node, err, c.want)
		}
	}
	if _, err := AcceptLoss(ctx, cli, 4, "", at); err != nil {
		t.Fatalf("partition 4, live only on a node not registered: %v", err)
	}
	loss, err := AcceptLoss(ctx, cli, 0, "n3", at)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Loss{Partition: 0, Node: "n3", Held: why, At: at}); loss != want {
		t.Errorf("loss %+v, want %+v", loss, want)
	}
	if _, err := AcceptLoss(ctx, cli, 0, "n3", at.Add(time.Second)); !errors.Is(err, ErrNotHeld) || !strings.Contains(err.Error(), "accepted at") {
		t.Errorf("a second acceptance: %v", err)
	}
	reps, err := Replicas(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		accepted := (r.Partition == 0 && r.Node == "n3") || (r.Partition == 4 && r.Node == "n2")
		if accepted != !r.LossAccepted.IsZero() || (accepted && !r.LossAccepted.Equal(at)) {
			t.Errorf("replica %d on %s: loss accepted %v", r.Partition, r.Node, r.LossAccepted)
		}
	}
	losses, err := Losses(ctx, cli)
	if err != nil || len(losses) != 2 || losses[0] != loss {
		t.Errorf("losses %+v, %v; want %+v", losses, err, loss)
	}
	for name, bad := range map[string]Replica{
		"held and live":      {Partition: 3, Node: "n1", State: recovery.ReplicaLive, Held: why},
		"accepted, not held": {Partition: 3, Node: "n1", State: recovery.ReplicaNeedsRejoin, LossAccepted: at},
	} {
		if err := SetReplica(ctx, cli, bad); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
