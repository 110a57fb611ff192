package supervise

import (
	"context"
	"errors"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

// BootstrappedKey marks a cluster that has bootstrapped (every node of its
// placement started and registered once, so it may hold writes). Replace writes it before
// it places a node that never started: without it, that node's absence
// would make the cluster look new again, and a node restarting then would
// bring its empty replicas up live. Never deleted but by layout.Init.
const BootstrappedKey = keyRoot + "bootstrapped"

// markNode stands for BootstrappedKey among incarnation records: a name no
// node can have (checkID refuses '/').
const markNode = "/bootstrapped"

// ErrRunning: Replace was asked to move replicas off or onto a node that
// is registered (running).
var ErrRunning = errors.New("supervise: node is running")

// ReplaceTxnPartitionsMax bounds the partitions one of Replace's
// transactions moves: five operations and two comparisons each, well
// under etcd's default --max-txn-ops of 128.
const ReplaceTxnPartitionsMax = 12

// Replace re-places every replica that the placement gives dead, a node
// that is not running, onto with, a node that is not running either: a
// node that died for good is replaced by a new one. Each moved replica is
// recorded needs-rejoin on with, so when with starts it rebuilds each from
// a live replica of its partition, with the same claims, fencing and
// supervision as a restart; the task, assignment and claim of a rejoin
// onto dead go with it. dead's replicas held nothing live (dead is not
// running), so no partition has fewer live replicas than before.
//
// Every partition moves in one transaction with its records, conditional
// on neither node having registered since they were read and on the
// placement of the partition being as read; so a partition is either moved
// whole or not at all, and a Replace interrupted (an etcd error, a node
// that started meanwhile) is finished by running it again. It returns the
// partitions it moved. A node that is running cannot take new replicas
// (it reads its placement at start): with must be started after Replace.
func Replace(ctx context.Context, cli *clientv3.Client, dead, with string) ([]uint32, error) {
	if err := checkID("node id", dead, nodeIDBytesMax); err != nil {
		return nil, err
	}
	if err := checkID("node id", with, nodeIDBytesMax); err != nil {
		return nil, err
	}
	if dead == with {
		return nil, fmt.Errorf("%w: replace %s with itself", ErrPlacement, dead)
	}
	nodes, err := Nodes(ctx, cli)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		switch n.ID {
		case dead:
			return nil, fmt.Errorf("%w: %s is registered: a node is replaced only once it is dead (stop it, and wait for its lease to end)", ErrRunning, dead)
		case with:
			return nil, fmt.Errorf("%w: %s is registered: a running node reads its placement only at start; stop it, or replace with a node id that is not running, then start it", ErrRunning, with)
		}
	}
	reps, rev, err := replicasRev(ctx, cli)
	if err != nil {
		return nil, err
	}
	on := map[uint32]map[string]int64{} // partition -> node -> mod revision
	for _, r := range reps {
		if on[r.Partition] == nil {
			on[r.Partition] = map[string]int64{}
		}
		on[r.Partition][r.Node] = r.modRev
	}
	var move []uint32
	var clash []uint32
	for p, at := range on {
		if _, ok := at[dead]; !ok {
			continue
		}
		if _, ok := at[with]; ok {
			clash = append(clash, p)
		}
		move = append(move, p)
	}
	slices.Sort(move)
	slices.Sort(clash)
	switch {
	case len(move) == 0:
		return nil, fmt.Errorf("%w: the placement gives %s no replica (replaced already, or not a node of this cluster)", ErrPlacement, dead)
	case len(clash) > 0:
		return nil, fmt.Errorf("%w: %s already hosts a replica of partitions %v that %s hosts: two replicas of a partition on one node", ErrPlacement, with, clash, dead)
	}
	all, _, err := incarnations(ctx, cli)
	if err != nil {
		return nil, err
	}
	var placed []string
	for _, r := range reps {
		placed = append(placed, r.Node)
	}
	booted := bootstrapped(all, placed)
	if booted {
		// Before any move: a crash between two transactions must not leave
		// the cluster looking unbootstrapped.
		if _, err := cli.Put(ctx, BootstrappedKey, "1"); err != nil {
			return nil, fmt.Errorf("supervise: replace: mark the cluster bootstrapped: %w", err)
		}
	}
	needs, err := encode(Replica{State: recovery.ReplicaNeedsRejoin})
	if err != nil {
		return nil, err
	}
	if !booted {
		// Not bootstrapped: no node took a write, every copy is empty and
		// with's replicas start live with the others.
		if needs, err = encode(Replica{State: recovery.ReplicaLive}); err != nil {
			return nil, err
		}
	}
	deadAbsent := clientv3.Compare(clientv3.CreateRevision(NodeKey(dead)), "=", 0)
	withAbsent := clientv3.Compare(clientv3.CreateRevision(NodeKey(with)), "=", 0)
	var moved []uint32
	for batch := range slices.Chunk(move, ReplaceTxnPartitionsMax) {
		cmps := []clientv3.Cmp{deadAbsent, withAbsent}
		var ops []clientv3.Op
		for _, p := range batch {
			task := claim.Task{Partition: p, Dest: dead}
			cmps = append(cmps,
				clientv3.Compare(clientv3.ModRevision(ReplicaKey(p, dead)), "=", on[p][dead]),
				clientv3.Compare(clientv3.CreateRevision(ReplicaKey(p, with)), "=", 0))
			ops = append(ops,
				clientv3.OpDelete(ReplicaKey(p, dead)),
				clientv3.OpPut(ReplicaKey(p, with), needs))
			ops = append(ops, deleteTask(task)...)
		}
		resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return moved, fmt.Errorf("supervise: replace %s with %s: %w (moved %d partitions; run it again to finish)", dead, with, err, len(moved))
		}
		if !resp.Succeeded {
			return moved, fmt.Errorf("%w: replace %s with %s: a node registered or the placement changed since revision %d (moved %d partitions; run it again to finish)", ErrRunning, dead, with, rev, len(moved))
		}
		moved = append(moved, batch...)
	}
	return moved, nil
}

// placedReplica is a replica record with its mod revision.
type placedReplica struct {
	Replica
	modRev int64
}

// replicasRev lists the replica records with their mod revisions, and the
// revision read at, in pages at one revision (rangeAt).
func replicasRev(ctx context.Context, cli *clientv3.Client) ([]placedReplica, int64, error) {
	kvs, rev, err := rangeAt(ctx, cli, replicasPrefix, 0)
	if err != nil {
		return nil, 0, err
	}
	out := make([]placedReplica, 0, len(kvs))
	for _, kv := range kvs {
		r, err := decodeReplica(kv)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, placedReplica{Replica: r, modRev: kv.ModRevision})
	}
	return out, rev, nil
}
