package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/wire"
)

// TestLapseHoldsTheLastReplica (issue 23: a network fault alone never
// takes the last live replica of a partition): n2 is cut from etcd past
// its lease; meanwhile a new process of n1, which cannot open a feed to
// n2, writes without it, and then n1 and n3 stop, so the writes n2
// missed are on no live replica. n2's settlement cannot
// say what it missed, and no other replica is live: failed, its replicas
// took every row of both partitions with them, where only the writes of
// the outage were gone. Held, they keep their rows and answer nothing,
// every call of their partitions is refused saying so, and once an admin
// accepts the loss (supervise.AcceptLoss, rejoin accept-loss) they are
// live again with every write from before the outage, and n1 and n3 are
// rebuilt from them.
func TestLapseHoldsTheLastReplica(t *testing.T) {
	const ttl = 2 * time.Second
	const parts = 2
	var logs logCatch
	c, px := newClusterN2ViaProxyWith(t, layout.Config{Partitions: parts, Replicas: 3, Tables: []layout.Table{layout.KV()}}, ttl, func(c *cluster) {
		c.onLog = func(id int, r slog.Record) {
			switch {
			case id != 2:
			case r.Message == "replica failed, needs a rejoin":
				logs.add("failed", id, r)
			case strings.HasPrefix(r.Message, "replica held"):
				logs.add("held", id, r)
			}
		}
	})
	cl2 := dialClient(t, c.nodes[2].addrs.TCP)
	waitWritable(t, cl2, parts)
	const before, outage = 150, 50
	for i := range before {
		upsert(t, cl2, parts, i)
	}
	px.Freeze()
	waitRegistered(t, c, "n2", false, 3*ttl+5*time.Second, "n2's lease to expire")
	// A new process: n1's open feed would have carried its writes to n2
	// (out of its view, still fed), and n2 would have missed nothing.
	c.stop(1)
	c.start(1)
	cl1 := dialClient(t, c.nodes[1].addrs.TCP)
	for i := before; i < before+outage; i++ {
		key := fmt.Sprintf("key-%06d", i)
		p, err := partition.RouteValues([]wire.Value{wire.Bytes([]byte(key))}, parts)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeWithin(cl1, p, key, 20*time.Second); err != nil {
			t.Fatalf("write %s through n1 while n2 is cut off: %v", key, err)
		}
	}
	c.stop(1)
	c.stop(3)
	px.Thaw()
	waitRegistered(t, c, "n2", true, 20*time.Second, "n2 registered again")
	waitUntil(t, 20*time.Second, "n2's replicas held", func() bool {
		held := 0
		for _, rs := range nodeStatus(t, c.nodes[2].addrs).Replicas {
			if rs.State == recovery.ReplicaHeld && rs.Held != "" && rs.Rows > 0 {
				held++
			}
		}
		if f := logs.seen("failed"); len(f) > 0 {
			t.Fatalf("n2 failed the last live replica of a partition: %v", f)
		}
		return held == parts
	})
	for _, s := range logs.seen("held") {
		t.Logf("%s", s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Published after the state changed, off the replica's loop.
	waitUntil(t, 5*time.Second, "n2's records needs-rejoin with the reason they are held", func() bool {
		reps, err := supervise.Replicas(ctx, c.admin)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reps {
			if r.Node == "n2" && (r.State != recovery.ReplicaNeedsRejoin || r.Held == "") {
				return false
			}
		}
		return true
	})
	// No rejoin task waits for a source that cannot be: one opened
	// while held would send a source to the replica once live again.
	// The node opens its tasks every 250 ms.
	time.Sleep(time.Second)
	tasks, err := claim.Tasks(ctx, c.admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range tasks {
		if tr.Task.Dest == "n2" {
			t.Errorf("a rejoin task for n2's held replica: %v %v", tr.Task, tr.Record.Status)
		}
	}
	waitUntil(t, 10*time.Second, "a call of a held partition refused, saying so", func() bool {
		_, err := cl2.call(0, partition.ProcDigest, false)
		return err != nil && strings.Contains(err.Error(), "is held on n2")
	})
	for p := range uint32(parts) {
		if _, err := supervise.AcceptLoss(ctx, c.admin, p, "", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 20*time.Second, "n2's replicas live after the loss was accepted", func() bool {
		live := 0
		for _, rs := range nodeStatus(t, c.nodes[2].addrs).Replicas {
			if rs.State == recovery.ReplicaLive {
				live++
			}
		}
		return live == parts
	})
	for i := range before {
		key := wire.Bytes(fmt.Appendf(nil, "key-%06d", i))
		p, err := partition.RouteValues([]wire.Value{key}, parts)
		if err != nil {
			t.Fatal(err)
		}
		if r := readAcked(t, cl2, p, key); !bytes.Contains(r.Out, fmt.Appendf(nil, "value-%d", i)) {
			t.Fatalf("write %s, acknowledged before the outage, reads %x", key, r.Out)
		}
	}
	// The writes of the outage are what n2 missed: they are gone with n1
	// and n3 (else this test held nothing it had to).
	missed := 0
	for i := before; i < before+outage; i++ {
		key := wire.Bytes(fmt.Appendf(nil, "key-%06d", i))
		p, err := partition.RouteValues([]wire.Value{key}, parts)
		if err != nil {
			t.Fatal(err)
		}
		switch _, err := cl2.call(p, partition.ProcRead, false, wire.String("kv"), key); {
		case err != nil && strings.Contains(err.Error(), "no row"):
			missed++
		case err != nil:
			t.Fatalf("read %s: %v", key, err)
		}
	}
	t.Logf("%d of the %d writes of the outage lost with n1 and n3", missed, outage)
	if missed == 0 {
		t.Fatalf("n2 holds every write of the outage: it missed nothing")
	}
	losses, err := supervise.Losses(ctx, c.admin)
	if err != nil || len(losses) != parts {
		t.Errorf("losses %+v, %v; want one a partition", losses, err)
	}
	c.start(1)
	c.start(3)
	i := before + outage
	waitUntil(t, 60*time.Second, "every replica live", func() bool {
		upsert(t, cl2, parts, i)
		i++
		return allLive(t, c)
	})
	checkDigests(t, cl2, parts, 3)
}
