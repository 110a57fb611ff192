package supervise

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
)

// A held replica (docs/DESIGN.md "Holding a partition") ends one of two
// ways: a live replica of its partition comes back and the supervisor
// rebuilds the held one from it, as any replica that needs a rejoin, or an
// admin accepts the loss. Neither is a node's to decide on its own: the
// admin's word is a write to the held replica's record (LossAccepted),
// which its node follows, and a loss record under lossesPrefix that stays
// for status and the chaos self-check to report.
const lossesPrefix = keyRoot + "losses/"

// LossesPrefix prefixes every loss record.
const LossesPrefix = lossesPrefix

// Loss is an admin's acceptance that partition Partition lacks what its
// held replica on Node missed: that replica went live again at its last
// txn.
type Loss struct {
	Partition uint32 `json:"partition"`
	Node      string `json:"node"`
	// Held is why the replica was held: what it may lack.
	Held string    `json:"held"`
	At   time.Time `json:"at"`
}

// ErrNotHeld: AcceptLoss found no held replica to make live, or one of
// the partition live (the held one is rebuilt from it, and loses
// nothing).
var ErrNotHeld = errors.New("supervise: no held replica")

func lossKey(p uint32, at time.Time) string {
	return fmt.Sprintf("%s%s/%020d", lossesPrefix, partitionSegment(p), at.UnixNano())
}

// AcceptLoss accepts the loss of what partition p's held replica on node
// missed ("" names the partition's only held replica), at: its record
// says so (Replica.LossAccepted) and a loss record is written, in one
// transaction that holds only if the replica's record is as read. It
// refuses while a replica of p is live (its record live and its node
// registered): the held one is rebuilt from it.
func AcceptLoss(ctx context.Context, cli *clientv3.Client, p uint32, node string, at time.Time) (Loss, error) {
	nodes, rev, err := rangeAt(ctx, cli, nodesPrefix, 0)
	if err != nil {
		return Loss{}, err
	}
	alive := map[string]bool{}
	for _, kv := range nodes {
		alive[strings.TrimPrefix(string(kv.Key), nodesPrefix)] = true
	}
	reps, _, err := rangeAt(ctx, cli, replicasPrefix+partitionSegment(p)+"/", rev)
	if err != nil {
		return Loss{}, err
	}
	var held []Replica
	for _, kv := range reps {
		r, err := decodeReplica(kv)
		if err != nil {
			return Loss{}, err
		}
		// A replica is live only while its node is registered: a
		// stopped node's record keeps its last state.
		if r.State == recovery.ReplicaLive && alive[r.Node] {
			return Loss{}, fmt.Errorf("%w: partition %d has a live replica on %s: a held one is rebuilt from it and loses nothing", ErrNotHeld, p, r.Node)
		}
		if r.Held != "" && (node == "" || r.Node == node) {
			held = append(held, r)
		}
	}
	switch {
	case len(held) == 0 && node != "":
		return Loss{}, fmt.Errorf("%w: partition %d has no held replica on %s", ErrNotHeld, p, node)
	case len(held) == 0:
		return Loss{}, fmt.Errorf("%w: partition %d has no held replica", ErrNotHeld, p)
	case len(held) > 1:
		var nodes []string
		for _, r := range held {
			nodes = append(nodes, r.Node)
		}
		slices.Sort(nodes)
		return Loss{}, fmt.Errorf("%w: partition %d has held replicas on %s: name the node whose replica goes live (the others are rebuilt from it)", ErrNotHeld, p, strings.Join(nodes, ", "))
	}
	r := held[0]
	at = normalize(at)
	if !r.LossAccepted.IsZero() {
		return Loss{}, fmt.Errorf("%w: the loss of partition %d on %s was accepted at %v already; its node has not made it live yet", ErrNotHeld, p, r.Node, r.LossAccepted)
	}
	loss := Loss{Partition: p, Node: r.Node, Held: r.Held, At: at}
	r.LossAccepted = at
	key, val, err := encodeReplica(r)
	if err != nil {
		return Loss{}, err
	}
	lossVal, err := encode(loss)
	if err != nil {
		return Loss{}, err
	}
	txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", r.ModRevision)).
		Then(clientv3.OpPut(key, val), clientv3.OpPut(lossKey(p, at), lossVal)).Commit()
	if err != nil {
		return Loss{}, fmt.Errorf("supervise: accept the loss of partition %d on %s: %w", p, r.Node, err)
	}
	if !txn.Succeeded {
		return Loss{}, fmt.Errorf("%w: partition %d's replica on %s changed meanwhile: look again", ErrNotHeld, p, r.Node)
	}
	return loss, nil
}

// Losses lists the losses accepted, oldest first in each partition, the
// partitions in order.
func Losses(ctx context.Context, cli *clientv3.Client) ([]Loss, error) {
	kvs, err := rangeAll(ctx, cli, lossesPrefix)
	if err != nil {
		return nil, err
	}
	out := make([]Loss, 0, len(kvs))
	for _, kv := range kvs {
		var l Loss
		if err := json.Unmarshal(kv.Value, &l); err != nil {
			return nil, fmt.Errorf("%w: loss %q: %w", ErrCorrupt, kv.Key, err)
		}
		l.At = normalize(l.At)
		out = append(out, l)
	}
	return out, nil
}

// ReplicaLive reports whether node's replica of p is live: its record
// says so and the node is registered.
func ReplicaLive(ctx context.Context, cli *clientv3.Client, p uint32, node string) (bool, error) {
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(ReplicaKey(p, node)), clientv3.OpGet(NodeKey(node))).Commit()
	if err != nil {
		return false, fmt.Errorf("supervise: read partition %d's replica on %s: %w", p, node, err)
	}
	rep, reg := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(rep) == 0 || len(reg) == 0 {
		return false, nil
	}
	r, err := decodeReplica(rep[0])
	if err != nil {
		return false, err
	}
	return r.State == recovery.ReplicaLive, nil
}
