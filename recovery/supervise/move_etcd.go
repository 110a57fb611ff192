package supervise

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

// movesPrefix holds one record per move under way, by partition. It lies
// outside the membership watch's range (nodes/ to replicas/).
const movesPrefix = keyRoot + "moves/"

// MoveKey is where the move of partition p is recorded while under way.
func MoveKey(p uint32) string { return movesPrefix + partitionSegment(p) }

// MoveView is a MoveState read from etcd at one time, with what the
// writes compare against: each record's mod revision.
type MoveView struct {
	MoveState
	// Bootstrapped: the cluster has bootstrapped; no move starts before.
	Bootstrapped bool
	repRev       map[string]int64 // by ReplicaKey
	moveRev      map[uint32]int64 // by partition
}

// ReadMoves reads the nodes, the placement and the moves under way.
func ReadMoves(ctx context.Context, cli *clientv3.Client) (*MoveView, error) {
	nodes, err := Nodes(ctx, cli)
	if err != nil {
		return nil, err
	}
	reps, _, err := replicasRev(ctx, cli)
	if err != nil {
		return nil, err
	}
	kvs, _, err := rangeAt(ctx, cli, movesPrefix, 0)
	if err != nil {
		return nil, err
	}
	v := &MoveView{MoveState: MoveState{Nodes: map[string]NodeRecord{}, Replicas: map[uint32][]Replica{}, Moves: map[uint32]Move{}},
		repRev: map[string]int64{}, moveRev: map[uint32]int64{}}
	for _, n := range nodes {
		v.Nodes[n.ID] = n
	}
	var placed []string
	for _, r := range reps {
		v.Replicas[r.Partition] = append(v.Replicas[r.Partition], r.Replica)
		v.repRev[ReplicaKey(r.Partition, r.Node)] = r.modRev
		placed = append(placed, r.Node)
	}
	for _, kv := range kvs {
		m, err := decodeMove(kv.Key, kv.Value)
		if err != nil {
			return nil, err
		}
		v.Moves[m.Partition], v.moveRev[m.Partition] = m, kv.ModRevision
	}
	all, _, err := incarnations(ctx, cli)
	if err != nil {
		return nil, err
	}
	v.Bootstrapped = bootstrapped(all, placed)
	return v, nil
}

// ListMoves lists the moves under way, by partition.
func ListMoves(ctx context.Context, cli *clientv3.Client) ([]Move, error) {
	kvs, _, err := rangeAt(ctx, cli, movesPrefix, 0)
	if err != nil {
		return nil, err
	}
	out := make([]Move, 0, len(kvs))
	for _, kv := range kvs {
		m, err := decodeMove(kv.Key, kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

func decodeMove(key, val []byte) (Move, error) {
	var m Move
	if err := json.Unmarshal(val, &m); err != nil {
		return Move{}, fmt.Errorf("%w: move %q: %w", ErrCorrupt, key, err)
	}
	p, err := parsePartition(string(key[len(movesPrefix):]))
	if err != nil {
		return Move{}, fmt.Errorf("%w: move key %q: %w", ErrCorrupt, key, err)
	}
	m.Partition = p
	return m, nil
}

// parsePartition reads a partition segment of a key.
func parsePartition(s string) (uint32, error) {
	p, _, err := parsePair(s + "/x")
	return p, err
}

// StartMove starts move m read in v: in one transaction, conditional on
// the placement of m's partition and To's registration being as read and
// no move of the partition under way, it records the move and adds To's
// replica needs-rejoin. To's node creates the replica and rebuilds it by a
// rejoin. Nothing is removed: the partition's live replicas stay.
func StartMove(ctx context.Context, cli *clientv3.Client, v *MoveView, m Move, now time.Time) error {
	to, up := v.Nodes[m.To]
	switch {
	case !v.Bootstrapped:
		return fmt.Errorf("%w: %s: the cluster has not bootstrapped yet (a node of its placement never started)", ErrMove, m)
	case !up:
		return fmt.Errorf("%w: %s: %s is not running: a move goes onto a running node (for one that is not, see rejoin replace)", ErrMove, m, m.To)
	case !v.hosts(m.Partition, m.From):
		return fmt.Errorf("%w: %s: %s holds no replica of it", ErrMove, m, m.From)
	case v.hosts(m.Partition, m.To):
		return fmt.Errorf("%w: %s: %s holds one already", ErrMove, m, m.To)
	}
	if _, busy := v.Moves[m.Partition]; busy {
		return fmt.Errorf("%w: %s: the partition is moving already", ErrMove, m)
	}
	m.Started = normalize(now)
	m.LiveBefore = LiveReplicas(v.Replicas[m.Partition], v.Nodes)
	rec, err := encode(m)
	if err != nil {
		return err
	}
	needs, err := encode(Replica{State: recovery.ReplicaNeedsRejoin})
	if err != nil {
		return err
	}
	// Without the mark, the new node's place in the placement could make
	// the cluster look new again to a node reading it before To's
	// incarnation (Replace writes it for the same reason).
	if _, err := cli.Put(ctx, BootstrappedKey, "1"); err != nil {
		return fmt.Errorf("supervise: start %s: mark the cluster bootstrapped: %w", m, err)
	}
	ops := []clientv3.Op{
		clientv3.OpPut(MoveKey(m.Partition), rec),
		clientv3.OpPut(ReplicaKey(m.Partition, m.To), needs),
	}
	// A task left from an earlier stay of the partition on To.
	ops = append(ops, deleteTask(claim.Task{Partition: m.Partition, Dest: m.To})...)
	resp, err := cli.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(MoveKey(m.Partition)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(ReplicaKey(m.Partition, m.To)), "=", 0),
		clientv3.Compare(clientv3.ModRevision(ReplicaKey(m.Partition, m.From)), "=", v.repRev[ReplicaKey(m.Partition, m.From)]),
		clientv3.Compare(clientv3.CreateRevision(NodeKey(m.To)), "=", to.Created),
	).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("supervise: start %s: %w", m, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: start %s: the placement or %s's registration changed since read; read again", ErrMoveNotReady, m, m.To)
	}
	return nil
}

// FinishMove ends move m read in v once CheckFinish allows it: in one
// transaction, conditional on the move, every replica record of the
// partition and the registration of every node counted live being as
// read, it removes From's replica, the move record and any rejoin task
// onto From. From's node then drops its replica. ErrMoveNotReady: not
// yet, or something changed; read again.
func FinishMove(ctx context.Context, cli *clientv3.Client, v *MoveView, m Move) error {
	if cur, ok := v.Moves[m.Partition]; !ok || cur.From != m.From || cur.To != m.To {
		return fmt.Errorf("%w: finish %s: no such move under way", ErrMove, m)
	}
	m = v.Moves[m.Partition]
	reps := v.Replicas[m.Partition]
	if err := CheckFinish(reps, v.Nodes, m); err != nil {
		return err
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(MoveKey(m.Partition)), "=", v.moveRev[m.Partition])}
	for _, r := range reps {
		key := ReplicaKey(r.Partition, r.Node)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", v.repRev[key]))
		if n, up := v.Nodes[r.Node]; up && r.State == recovery.ReplicaLive {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(NodeKey(r.Node)), "=", n.Created))
		}
	}
	old := claim.Task{Partition: m.Partition, Dest: m.From}
	resp, err := cli.Txn(ctx).If(cmps...).Then(append([]clientv3.Op{
		clientv3.OpDelete(ReplicaKey(m.Partition, m.From)),
		clientv3.OpDelete(MoveKey(m.Partition)),
	}, deleteTask(old)...)...).Commit()
	if err != nil {
		return fmt.Errorf("supervise: finish %s: %w", m, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: finish %s: the partition's replicas or their nodes changed since read; read again", ErrMoveNotReady, m)
	}
	return nil
}

// CancelMove deletes the record of move m read in v whose new replica's
// record is gone (a `rejoin replace` moved it off a dead node, or an
// operator deleted it): it can never finish, and would hold its partition
// and its limits forever. Conditional on the move and the absence of To's
// record as read.
func CancelMove(ctx context.Context, cli *clientv3.Client, v *MoveView, m Move) error {
	if v.hosts(m.Partition, m.To) {
		return fmt.Errorf("%w: cancel %s: the new replica is placed; it finishes", ErrMove, m)
	}
	resp, err := cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(MoveKey(m.Partition)), "=", v.moveRev[m.Partition]),
		clientv3.Compare(clientv3.CreateRevision(ReplicaKey(m.Partition, m.To)), "=", 0),
	).Then(clientv3.OpDelete(MoveKey(m.Partition))).Commit()
	if err != nil {
		return fmt.Errorf("supervise: cancel %s: %w", m, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: cancel %s: changed since read; read again", ErrMoveNotReady, m)
	}
	return nil
}

// UndoMove takes back the move of partition p read in v, by hand, while
// its new replica is still being rebuilt: in one transaction, conditional
// on the move and the new replica's record being as read, it removes the
// new replica's record, the move, and the rejoin task onto it. The new
// holder drops the replica (its rejoin, if one runs, aborts) and the old
// one stays. A new replica that is live already is not taken back: the
// move finishes, and a move the other way undoes it.
func UndoMove(ctx context.Context, cli *clientv3.Client, v *MoveView, p uint32) (Move, error) {
	m, ok := v.Moves[p]
	if !ok {
		return Move{}, fmt.Errorf("%w: partition %d: no move under way", ErrMove, p)
	}
	key := ReplicaKey(p, m.To)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(MoveKey(p)), "=", v.moveRev[p])}
	for _, r := range v.Replicas[p] {
		if r.Node == m.To && r.State == recovery.ReplicaLive {
			return m, fmt.Errorf("%w: undo %s: the replica on %s is live already; the move finishes (rejoin drain or rebalance), and a move back undoes it", ErrMove, m, m.To)
		}
	}
	if v.hosts(p, m.To) {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", v.repRev[key]))
	} else {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
	}
	task := claim.Task{Partition: p, Dest: m.To}
	resp, err := cli.Txn(ctx).If(cmps...).Then(append([]clientv3.Op{
		clientv3.OpDelete(key),
		clientv3.OpDelete(MoveKey(p)),
	}, deleteTask(task)...)...).Commit()
	if err != nil {
		return m, fmt.Errorf("supervise: undo %s: %w", m, err)
	}
	if !resp.Succeeded {
		return m, fmt.Errorf("%w: undo %s: the move or its new replica changed since read; read again", ErrMoveNotReady, m)
	}
	return m, nil
}

// Planner is PlanDrain or PlanRebalance with its arguments bound.
type Planner func(MoveState) ([]Move, bool, error)

// MoveEvent is what one MovePass did: a move started, finished, or
// cancelled (its new replica's record gone: CancelMove), or, with Waiting
// set, a move under way that may not finish yet and what it waits for.
type MoveEvent struct {
	Move      Move
	Finished  bool
	Cancelled bool
	// Waiting says what the move under way waits for, in words.
	Waiting string
	// NoTask: the new replica is not live and no rejoin task onto it is
	// open: its node has not asked for a rejoin yet. A move that stays so
	// makes no progress on its own (the caller bounds it).
	NoTask bool
}

// moveWait is what move m, not ready by err, waits for: the new
// replica's rejoin (its task, if opened) or the other replicas.
func moveWait(ctx context.Context, cli *clientv3.Client, v *MoveView, m Move, err error) (MoveEvent, error) {
	ev := MoveEvent{Move: m, Waiting: err.Error()}
	if _, up := v.Nodes[m.To]; !up {
		ev.Waiting = fmt.Sprintf("%s is not running; the move goes on when it is back (rejoin undo-move %d takes it back)", m.To, m.Partition)
		return ev, nil
	}
	var state recovery.ReplicaState
	others := 0
	for _, r := range v.Replicas[m.Partition] {
		if r.Node == m.To {
			state = r.State
		}
		if _, up := v.Nodes[r.Node]; up && r.State == recovery.ReplicaLive && r.Node != m.From {
			others++
		}
	}
	if state == recovery.ReplicaLive {
		ev.Waiting = fmt.Sprintf("the replica on %s is live, but without %s's the partition would have %d live replicas, fewer than the %d before the move: waiting for the others to be live", m.To, m.From, others, m.LiveBefore)
		return ev, nil
	}
	rec, err := claim.GetTask(ctx, cli, claim.Task{Partition: m.Partition, Dest: m.To})
	switch {
	case errors.Is(err, claim.ErrNoTask):
		ev.NoTask = true
		ev.Waiting = fmt.Sprintf("the replica on %s is %s and no rejoin task onto it is open yet (%s opens one once every running node's view shows the replica)", m.To, state, m.To)
	case err != nil:
		return ev, err
	default:
		ev.Waiting = fmt.Sprintf("the replica on %s is %s; its rejoin task is %s", m.To, state, rec.Status)
		if rec.Executor != "" {
			ev.Waiting += fmt.Sprintf(" (attempt %d, %s)", rec.Attempts, rec.Executor)
		}
		if rec.Note != "" {
			ev.Waiting += ": " + rec.Note
		}
	}
	return ev, nil
}

// MovePass is one pass of a drain or rebalance: it reads the moves, ends
// those whose new replica is live (FinishMove), says what the others
// wait for (an event with Waiting), cancels those whose new replica's
// record is gone (CancelMove), reads again if any ended, and starts what
// plan says. done: plan says there is nothing left.
// A move that is not ready, or whose records changed, waits for the next
// pass; any other error ends the pass.
func MovePass(ctx context.Context, cli *clientv3.Client, plan Planner, now time.Time) (events []MoveEvent, done bool, err error) {
	v, err := ReadMoves(ctx, cli)
	if err != nil {
		return nil, false, err
	}
	finished := false
	for _, p := range sortedPartitions(v.Moves) {
		m := v.Moves[p]
		if !v.hosts(p, m.To) {
			switch err := CancelMove(ctx, cli, v, m); {
			case err == nil:
				events, finished = append(events, MoveEvent{Move: m, Cancelled: true}), true
			case !errors.Is(err, ErrMoveNotReady):
				return events, false, err
			}
			continue
		}
		switch err := FinishMove(ctx, cli, v, m); {
		case err == nil:
			events, finished = append(events, MoveEvent{Move: m, Finished: true}), true
		case errors.Is(err, ErrMoveNotReady):
			ev, err := moveWait(ctx, cli, v, m, err)
			if err != nil {
				return events, false, err
			}
			events = append(events, ev)
		default:
			return events, false, err
		}
	}
	if finished {
		if v, err = ReadMoves(ctx, cli); err != nil {
			return events, false, err
		}
	}
	start, done, err := plan(v.MoveState)
	if err != nil || done {
		return events, done, err
	}
	for _, m := range start {
		switch err := StartMove(ctx, cli, v, m, now); {
		case err == nil:
			events = append(events, MoveEvent{Move: m})
		case errors.Is(err, ErrMoveNotReady):
		default:
			return events, false, err
		}
	}
	return events, false, nil
}

func sortedPartitions(ms map[uint32]Move) []uint32 {
	ps := make([]uint32, 0, len(ms))
	for p := range ms {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// deleteTask is the deletes of a rejoin task's records: its record, its
// assignment and its claim, for a replica that goes (or comes back) with
// the same transaction.
func deleteTask(task claim.Task) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpDelete(task.RecordKey()),
		clientv3.OpDelete(AssignmentKey(task)),
		clientv3.OpDelete(task.ClaimKey()),
	}
}
