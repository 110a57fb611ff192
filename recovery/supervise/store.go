package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// Nodes lists the registered (live) nodes in id order.
func Nodes(ctx context.Context, cli *clientv3.Client) ([]NodeRecord, error) {
	kvs, err := rangeAll(ctx, cli, nodesPrefix)
	if err != nil {
		return nil, err
	}
	out := make([]NodeRecord, 0, len(kvs))
	for _, kv := range kvs {
		n, err := decodeNode(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// SetReplica records that r.Node hosts a replica of r.Partition in
// r.State. The node calls it when the replica changes state (a rejoin
// done, a start with needs-rejoin replicas).
func SetReplica(ctx context.Context, cli *clientv3.Client, r Replica) error {
	key, val, err := encodeReplica(r)
	if err != nil {
		return err
	}
	if _, err := cli.Put(ctx, key, val); err != nil {
		return fmt.Errorf("supervise: set replica %d on %s: %w", r.Partition, r.Node, err)
	}
	return nil
}

// encodeReplica checks r and returns its record's key and value: what
// SetReplica, UpdateReplica and SetReplicas write.
func encodeReplica(r Replica) (key, val string, err error) {
	if err := checkID("node id", r.Node, nodeIDBytesMax); err != nil {
		return "", "", err
	}
	if err := r.check(); err != nil {
		return "", "", fmt.Errorf("%w: replica %d on %s: %w", ErrConfig, r.Partition, r.Node, err)
	}
	if val, err = encode(r); err != nil {
		return "", "", err
	}
	return ReplicaKey(r.Partition, r.Node), val, nil
}

// ErrNotPlaced: UpdateReplica found no record of the replica: the
// placement no longer gives the node that partition (a move ended).
var ErrNotPlaced = errors.New("supervise: replica not placed")

// UpdateReplica is SetReplica for a record that exists, else ErrNotPlaced:
// what a node writes when its replica changes state. A replica that a
// move took off its node must not come back to the placement by a late
// state change of the node that drops it (docs/DESIGN.md "Membership
// moves"). With r.Created set, only the record created at that revision
// is: one removed and placed on the node again since is another replica's.
func UpdateReplica(ctx context.Context, cli *clientv3.Client, r Replica) error {
	key, val, err := encodeReplica(r)
	if err != nil {
		return err
	}
	exists := clientv3.Compare(clientv3.CreateRevision(key), ">", 0)
	if r.Created != 0 {
		exists = clientv3.Compare(clientv3.CreateRevision(key), "=", r.Created)
	}
	resp, err := cli.Txn(ctx).If(exists).Then(clientv3.OpPut(key, val)).Commit()
	if err != nil {
		return fmt.Errorf("supervise: update replica %d on %s: %w", r.Partition, r.Node, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: partition %d on %s", ErrNotPlaced, r.Partition, r.Node)
	}
	return nil
}

// ReplicasTxnOpsMax bounds the puts of one of SetReplicas's
// transactions, well under etcd's default --max-txn-ops of 128.
const ReplicasTxnOpsMax = 64

// SetReplicas is SetReplica for many replicas, in transactions of at most
// ReplicasTxnOpsMax puts: a node hosting thousands of replicas records
// them at start in a few round trips instead of one each. Every record is
// checked before any is written; on an etcd error the records of the
// transactions before it are written, which writing them again repairs.
func SetReplicas(ctx context.Context, cli *clientv3.Client, rs []Replica) error {
	ops := make([]clientv3.Op, 0, len(rs))
	for _, r := range rs {
		key, val, err := encodeReplica(r)
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(key, val))
	}
	for len(ops) > 0 {
		n := min(len(ops), ReplicasTxnOpsMax)
		if _, err := cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			return fmt.Errorf("supervise: set %d replicas: %w", len(rs), err)
		}
		ops = ops[n:]
	}
	return nil
}

// Replicas lists the placement in key order (partition, then node).
func Replicas(ctx context.Context, cli *clientv3.Client) ([]Replica, error) {
	kvs, err := rangeAll(ctx, cli, replicasPrefix)
	if err != nil {
		return nil, err
	}
	out := make([]Replica, 0, len(kvs))
	for _, kv := range kvs {
		r, err := decodeReplica(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// GetAssignment reads a task's assignment; found is false if it has none.
func GetAssignment(ctx context.Context, cli *clientv3.Client, task claim.Task) (a Assignment, found bool, err error) {
	resp, err := cli.Get(ctx, AssignmentKey(task))
	if err != nil {
		return Assignment{}, false, fmt.Errorf("supervise: read assignment of %s: %w", task, err)
	}
	if len(resp.Kvs) == 0 {
		return Assignment{}, false, nil
	}
	a, err = decodeAssignment(resp.Kvs[0])
	return a, err == nil, err
}

// Decline is a source refusing the task it was assigned as attempt seq
// (DESIGN.md step 9: too busy when assigned). The supervisor assigns the task
// elsewhere at its next pass and not to node again in this generation. It
// is ErrNotAssigned when the assignment is no longer node's at seq.
func Decline(ctx context.Context, cli *clientv3.Client, task claim.Task, node string, seq uint32) error {
	a, found, err := GetAssignment(ctx, cli, task)
	if err != nil {
		return err
	}
	if !found || a.Source != node || a.Seq != seq {
		return fmt.Errorf("%w: %s attempt %d", ErrNotAssigned, task, seq)
	}
	if !a.declinedBy(node) {
		a.Declined = append(a.Declined, node)
	}
	val, err := encode(a)
	if err != nil {
		return err
	}
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(AssignmentKey(task)), "=", a.ModRevision)).
		Then(clientv3.OpPut(AssignmentKey(task), val)).
		Commit()
	if err != nil {
		return fmt.Errorf("supervise: decline %s: %w", task, err)
	}
	if !resp.Succeeded {
		// Only the supervisor writes assignments besides the source: it
		// changed it meanwhile, so this attempt is no longer node's.
		return fmt.Errorf("%w: %s reassigned meanwhile", ErrNotAssigned, task)
	}
	return nil
}

// Complete records attempt a's completion through claim.MarkDone, which
// accepts it from any attempt of the task's generation (DESIGN.md step 9). A
// later completion of a task already done changes nothing: it is logged
// and reported with dup set, not as an error.
func Complete(ctx context.Context, cli *clientv3.Client, a claim.Attempt, now time.Time, log *slog.Logger) (rec claim.Record, dup bool, err error) {
	rec, err = claim.MarkDone(ctx, cli, a, now)
	if errors.Is(err, claim.ErrDuplicate) {
		if log == nil {
			log = slog.Default()
		}
		log.Info("supervise: duplicate completion ignored", "task", a.Task.String(),
			"epoch", a.Epoch, "executor", a.Executor, "done_by", rec.Executor, "done_epoch", rec.Epoch)
		return rec, true, nil
	}
	return rec, false, err
}

// CompleteAgain reports whether a destination gone live tries again to
// complete its task after err, Complete's answer (recovery/node's
// completeLive and the simulator's destination, one rule for both): a
// task left open sends new attempts to a replica that refuses them as
// live, so every error but a final one is tried again. Final: taken
// (nil, or a duplicate of the source's completion), of a generation that
// ended (claim.ErrStaleEpoch), or of a task gone (claim.ErrNoTask).
func CompleteAgain(err error) bool {
	return err != nil && !errors.Is(err, claim.ErrStaleEpoch) && !errors.Is(err, claim.ErrNoTask) && !errors.Is(err, claim.ErrDuplicate)
}

// snapshotPartitionsMax bounds the partitions whose replica records a
// snapshot reads one range each; past it, it reads the whole placement.
const snapshotPartitionsMax = 64

// ReadSnapshot reads what a pass decides on: the task records
// (claim.TasksRev), then nodes, placement, claims and assignments in one
// transaction as of the same revision, so the pass sees one state. It may
// be stale by the time the pass writes; every write of the pass is a
// compare-and-swap, so a stale view costs a retry at the next pass, never
// a wrong write.
func ReadSnapshot(ctx context.Context, cli *clientv3.Client) (Snapshot, error) {
	return readSnapshot(ctx, cli, true)
}

// readPassSnapshot is ReadSnapshot for a pass: its placement is only that
// of the partitions with a task not final, the only ones Decide picks a
// source for, while they are at most snapshotPartitionsMax. A pass every
// 200 ms over a cluster of 4096 partitions x 3 replicas read 12,288
// replica records each time, when there was nothing to decide.
func readPassSnapshot(ctx context.Context, cli *clientv3.Client) (Snapshot, error) {
	return readSnapshot(ctx, cli, false)
}

func readSnapshot(ctx context.Context, cli *clientv3.Client, placement bool) (Snapshot, error) {
	tasks, rev, err := claim.TasksRev(ctx, cli)
	if err != nil {
		return Snapshot{}, err
	}
	// The rest is read as of the tasks' revision: one state of the
	// cluster, not tasks of one moment and claims of the next.
	prefixes := []string{nodesPrefix, claimsPrefix, assignPrefix}
	parts := map[uint32]bool{}
	for _, t := range tasks {
		if !t.Status.Final() {
			parts[t.Task.Partition] = true
		}
	}
	if placement || len(parts) > snapshotPartitionsMax {
		prefixes = append(prefixes, replicasPrefix)
	} else {
		for p := range parts {
			prefixes = append(prefixes, replicasPrefix+partitionSegment(p)+"/")
		}
	}
	ops := make([]clientv3.Op, len(prefixes))
	for i, p := range prefixes {
		ops[i] = clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithLimit(snapshotKeysMax+1), clientv3.WithRev(rev))
	}
	resp, err := cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return Snapshot{}, fmt.Errorf("supervise: read snapshot: %w", err)
	}
	s := Snapshot{
		Nodes:       map[string]NodeRecord{},
		Replicas:    map[uint32][]Replica{},
		Tasks:       tasks,
		Claims:      map[claim.Task]uint64{},
		Assignments: map[claim.Task]Assignment{},
	}
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) > snapshotKeysMax {
			return Snapshot{}, fmt.Errorf("supervise: more than %d keys under %s", snapshotKeysMax, prefixes[i])
		}
		prefix := prefixes[i]
		if strings.HasPrefix(prefix, replicasPrefix) {
			prefix = replicasPrefix
		}
		for _, kv := range kvs {
			if err := s.add(prefix, kv); err != nil {
				return Snapshot{}, err
			}
		}
	}
	return s, nil
}

func (s *Snapshot) add(prefix string, kv *mvccpb.KeyValue) error {
	switch prefix {
	case nodesPrefix:
		n, err := decodeNode(kv)
		if err != nil {
			return err
		}
		s.Nodes[n.ID] = n
	case replicasPrefix:
		r, err := decodeReplica(kv)
		if err != nil {
			return err
		}
		s.Replicas[r.Partition] = append(s.Replicas[r.Partition], r)
	case claimsPrefix:
		p, dest, err := parseRecordKey(kv.Key, claimsPrefix)
		if err != nil {
			return err
		}
		s.Claims[claim.Task{Partition: p, Dest: dest}] = uint64(kv.CreateRevision)
	case assignPrefix:
		a, err := decodeAssignment(kv)
		if err != nil {
			return err
		}
		s.Assignments[a.Task] = a
	}
	return nil
}

// rangeAll reads every key under prefix, at most snapshotKeysMax, a page
// at a time at the first page's revision.
func rangeAll(ctx context.Context, cli *clientv3.Client, prefix string) ([]*mvccpb.KeyValue, error) {
	kvs, _, err := rangeAt(ctx, cli, prefix, 0)
	return kvs, err
}
