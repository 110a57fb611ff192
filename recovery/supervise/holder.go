package supervise

import (
	"context"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// ExecutorID is the executor id a node's source claims a task with:
// "<node>/host:pid:nonce" (claim.NewExecutorID after the node's id, which
// never contains '/'). The claim key then names the node that holds it,
// so the destination can check that the node whose rejoin hello it reads
// is the one etcd gave the attempt to (ClaimHolder).
func ExecutorID(node string) string { return node + "/" + claim.NewExecutorID() }

// Holder is who holds a task's claim: the node named by the executor id
// in the claim key (empty if the id names none) and the claim's epoch
// (the key's CreateRevision).
type Holder struct {
	Task  claim.Task
	Node  string
	Epoch uint64
	// Executor is the claim key's value, whole.
	Executor string
}

// ClaimHolder reads who holds task's claim; found is false if nobody does.
// The read is linearizable: a claim acquired before the call is seen.
func ClaimHolder(ctx context.Context, cli *clientv3.Client, task claim.Task) (h Holder, found bool, err error) {
	resp, err := cli.Get(ctx, task.ClaimKey())
	if err != nil {
		return Holder{}, false, fmt.Errorf("supervise: read claim of %s: %w", task, err)
	}
	if len(resp.Kvs) == 0 {
		return Holder{}, false, nil
	}
	h, err = decodeHolder(resp.Kvs[0])
	return h, err == nil, err
}

// HolderAndAssignment reads who holds task's claim and the task's
// assignment in one read (one round trip, one revision): what a
// destination checks a rejoin hello against. found and assigned say
// whether each exists.
func HolderAndAssignment(ctx context.Context, cli *clientv3.Client, task claim.Task) (h Holder, found bool, a Assignment, assigned bool, err error) {
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(task.ClaimKey()), clientv3.OpGet(AssignmentKey(task))).Commit()
	if err != nil {
		return Holder{}, false, Assignment{}, false, fmt.Errorf("supervise: read claim and assignment of %s: %w", task, err)
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if h, err = decodeHolder(kvs[0]); err != nil {
			return Holder{}, false, Assignment{}, false, err
		}
		found = true
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		if a, err = decodeAssignment(kvs[0]); err != nil {
			return Holder{}, false, Assignment{}, false, err
		}
		assigned = true
	}
	return h, found, a, assigned, nil
}

// decodeHolder reads a claim key. An executor id without a node part (a
// claim taken with claim.NewExecutorID alone) is a holder with no node:
// claim allows such ids, so it is not corrupt, but it names nobody.
func decodeHolder(kv *mvccpb.KeyValue) (Holder, error) {
	p, dest, err := parseRecordKey(kv.Key, claimsPrefix)
	if err != nil {
		return Holder{}, err
	}
	if kv.CreateRevision <= 0 {
		return Holder{}, fmt.Errorf("%w: claim %q: create revision %d", ErrCorrupt, kv.Key, kv.CreateRevision)
	}
	h := Holder{Task: claim.Task{Partition: p, Dest: dest}, Epoch: uint64(kv.CreateRevision), Executor: string(kv.Value)}
	if node, _, ok := strings.Cut(h.Executor, "/"); ok && checkID("node id", node, nodeIDBytesMax) == nil {
		h.Node = node
	}
	return h, nil
}
