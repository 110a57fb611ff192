package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limits of the task record store.
const (
	// casAttemptsMax bounds the read-modify-write retries of one record
	// change when others change the record meanwhile. Writers of one record
	// are few (its attempt, a completion, the health task), so running out
	// means something is looping, and it is reported.
	casAttemptsMax = 8
	// listPageKeys is how many keys one range read returns.
	listPageKeys = 256
	// TasksMax bounds the task records and claims one listing reads: a
	// partition count times the nodes that rejoin at once, with room.
	TasksMax = 1 << 16
)

// ErrContention: a record change lost casAttemptsMax compare-and-swaps in
// a row.
var ErrContention = errors.New("claim: task record kept changing")

// ErrFenced: a guard the caller passed (a supervisor's election key, say)
// no longer held, so nothing was written.
var ErrFenced = errors.New("claim: guard failed, nothing written")

// TaskRecord is a record with the task it belongs to.
type TaskRecord struct {
	Task Task
	Record
}

// Reset is one task ResetStale put back to pending.
type Reset struct {
	Task Task
	Was  Record // the record before the reset
	Why  string
}

// CreateTask opens a task as pending, attempts 0. If its record is done or
// failed, a new generation is opened (the old record is deleted, then a
// fresh one created, so that Opened, the record key's CreateRevision, rises
// past every claim of the old generation). A pending or running task is
// ErrTaskOpen, returned with its record.
func CreateTask(ctx context.Context, cli *clientv3.Client, task Task, now time.Time) (Record, error) {
	if err := task.validate(); err != nil {
		return Record{}, err
	}
	now = normalize(now)
	key := task.RecordKey()
	for range casAttemptsMax {
		cur, found, err := getRecord(ctx, cli, task)
		if err != nil {
			return Record{}, err
		}
		if found && !cur.Status.Final() {
			return cur, fmt.Errorf("%w: %s is %s", ErrTaskOpen, task, cur.Status)
		}
		if found {
			// Close the old generation; the next round creates the new one.
			if _, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision)).
				Then(clientv3.OpDelete(key)).
				Commit(); err != nil {
				return Record{}, fmt.Errorf("claim: close old generation of %s: %w", task, err)
			}
			continue
		}
		rec := Record{Status: StatusPending, UpdatedAt: now}
		val, err := encodeRecord(rec)
		if err != nil {
			return Record{}, err
		}
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, val)).
			Commit()
		if err != nil {
			return Record{}, fmt.Errorf("claim: create task %s: %w", task, err)
		}
		if resp.Succeeded {
			rec.Opened, rec.ModRevision = uint64(resp.Header.Revision), resp.Header.Revision
			return rec, nil
		}
	}
	return Record{}, fmt.Errorf("%w: creating %s", ErrContention, task)
}

// GetTask reads a task's record; ErrNoTask if there is none.
func GetTask(ctx context.Context, cli *clientv3.Client, task Task) (Record, error) {
	rec, found, err := getRecord(ctx, cli, task)
	if err == nil && !found {
		err = fmt.Errorf("%w: %s", ErrNoTask, task)
	}
	return rec, err
}

// Tasks lists every task record in key order (partition, then node), as
// of one revision.
func Tasks(ctx context.Context, cli *clientv3.Client) ([]TaskRecord, error) {
	out, _, err := listTasks(ctx, cli)
	return out, err
}

// TasksRev is Tasks with the revision it read at, so that a caller can
// read other keys as of the same revision (clientv3.WithRev) and see one
// consistent state.
func TasksRev(ctx context.Context, cli *clientv3.Client) ([]TaskRecord, int64, error) {
	return listTasks(ctx, cli)
}

// listTasks is Tasks, with the revision it read at.
func listTasks(ctx context.Context, cli *clientv3.Client) ([]TaskRecord, int64, error) {
	kvs, rev, err := listPrefix(ctx, cli, tasksPrefix, 0)
	if err != nil {
		return nil, 0, err
	}
	out := make([]TaskRecord, 0, len(kvs))
	for _, kv := range kvs {
		task, err := parseTask(strings.TrimPrefix(string(kv.Key), tasksPrefix))
		if err != nil {
			return nil, 0, err
		}
		rec, err := decodeRecord(kv)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, TaskRecord{Task: task, Record: rec})
	}
	return out, rev, nil
}

// StartTask moves the task to running for attempt a, which must hold the
// task's claim: the write compares the claim key (CreateRevision a.Epoch,
// value a.Executor) in the same transaction, so a superseded executor
// cannot start it. Attempts counts one more start. Starting again under the
// same attempt returns the record unchanged.
func StartTask(ctx context.Context, cli *clientv3.Client, a Attempt, now time.Time) (Record, error) {
	now = normalize(now)
	return updateAsHolder(ctx, cli, a, func(r Record) (Record, bool, error) {
		return StartRecord(r, a, now)
	})
}

// Touch refreshes the running task's UpdatedAt, as its holder. An
// executor calls it when its attempt has made progress since the last
// call (blocks acknowledged, the handoff acknowledged), so UpdatedAt says
// when the attempt last moved, not when it started: a rejoin that moves
// on is never stale however long it runs, one that stalls is (DESIGN.md
// step 1). Call it more often than the staleness ResetStale is run with.
func Touch(ctx context.Context, cli *clientv3.Client, a Attempt, now time.Time) (Record, error) {
	now = normalize(now)
	return updateAsHolder(ctx, cli, a, func(r Record) (Record, bool, error) {
		r, err := TouchRecord(r, a, now)
		return r, err == nil, err
	})
}

// Requeue puts the running task back to pending, as its holder, for
// another attempt; note says why. The holder then releases its claim.
func Requeue(ctx context.Context, cli *clientv3.Client, a Attempt, note string, now time.Time) (Record, error) {
	now = normalize(now)
	return updateAsHolder(ctx, cli, a, func(r Record) (Record, bool, error) {
		r, err := RequeueRecord(r, a, note, now)
		return r, err == nil, err
	})
}

// MarkFailed gives the running task up, as its holder; note says why.
// The holder then releases its claim.
func MarkFailed(ctx context.Context, cli *clientv3.Client, a Attempt, note string, now time.Time) (Record, error) {
	now = normalize(now)
	return updateAsHolder(ctx, cli, a, func(r Record) (Record, bool, error) {
		r, err := FailRecord(r, a, note, now)
		return r, err == nil, err
	})
}

// MarkDone records attempt a's completion. Any attempt of this generation
// is accepted, whether or not it still holds the claim (DESIGN.md step 9: the
// outcome is the same whoever produced it); an attempt of an earlier
// generation is ErrStaleEpoch. A task already done is left as it is and
// ErrDuplicate is returned with its record, naming the first completer.
//
// In the same transaction, a claim on the task held by another attempt is
// deleted: that attempt sees its claim gone within a window and stops. The
// completer's own claim is left for its Release.
func MarkDone(ctx context.Context, cli *clientv3.Client, a Attempt, now time.Time) (Record, error) {
	if err := a.Task.validate(); err != nil {
		return Record{}, err
	}
	now = normalize(now)
	key, claimKey := a.Task.RecordKey(), a.Task.ClaimKey()
	for range casAttemptsMax {
		cur, found, err := getRecord(ctx, cli, a.Task)
		if err != nil {
			return Record{}, err
		}
		if !found {
			return Record{}, fmt.Errorf("%w: %s", ErrNoTask, a.Task)
		}
		next, err := DoneRecord(cur, a, now)
		if err != nil {
			return cur, err
		}
		val, err := encodeRecord(next)
		if err != nil {
			return Record{}, err
		}
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision)).
			Then(clientv3.OpPut(key, val),
				clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(claimKey), "!=", int64(a.Epoch))},
					[]clientv3.Op{clientv3.OpDelete(claimKey)}, nil)).
			Commit()
		if err != nil {
			return Record{}, fmt.Errorf("claim: mark %s done: %w", a.Task, err)
		}
		if resp.Succeeded {
			next.ModRevision = resp.Header.Revision
			return next, nil
		}
	}
	return Record{}, fmt.Errorf("%w: marking %s done", ErrContention, a.Task)
}

// ResetStale puts back to pending every running task whose attempt's claim
// is gone (no claim key, or one of another epoch) or whose UpdatedAt is
// more than staleAfter before now (DESIGN.md step 1: N check windows). It is the
// health task of DESIGN.md step 10, run by the coordinator's leader only. When the
// attempt's claim still exists, it is deleted in the same transaction, so
// its executor sees it gone within a window and stops.
//
// A record that changes between the read and the write is skipped: whoever
// changed it is alive, and the next run looks again.
//
// Every write also checks guards (none: unconditional), so a deposed
// leader that has not noticed yet writes nothing: the first failed guard
// ends the run with ErrFenced and the resets made before it.
func ResetStale(ctx context.Context, cli *clientv3.Client, now time.Time, staleAfter time.Duration, guards ...clientv3.Cmp) ([]Reset, error) {
	if staleAfter <= 0 {
		return nil, fmt.Errorf("%w: staleAfter %s", ErrConfig, staleAfter)
	}
	now = normalize(now)
	tasks, rev, err := listTasks(ctx, cli)
	if err != nil {
		return nil, err
	}
	claims, _, err := listPrefix(ctx, cli, claimsPrefix, rev)
	if err != nil {
		return nil, err
	}
	claimEpoch := make(map[string]uint64, len(claims))
	for _, kv := range claims {
		claimEpoch[strings.TrimPrefix(string(kv.Key), claimsPrefix)] = uint64(kv.CreateRevision)
	}
	var resets []Reset
	for _, t := range tasks {
		why := StaleReason(t.Record, claimEpoch[t.Task.suffix()], now, staleAfter)
		if why == "" {
			continue
		}
		val, err := encodeRecord(ResetRecord(t.Record, why, now))
		if err != nil {
			return resets, err
		}
		key, claimKey := t.Task.RecordKey(), t.Task.ClaimKey()
		// The guards are the outer transaction's condition and the
		// record's revision the inner one's, so a failed guard is told
		// apart from a record that moved on.
		reset := clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", t.ModRevision)},
			[]clientv3.Op{clientv3.OpPut(key, val),
				clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(claimKey), "=", int64(t.Epoch))},
					[]clientv3.Op{clientv3.OpDelete(claimKey)}, nil)},
			nil)
		resp, err := cli.Txn(ctx).If(guards...).Then(reset).Commit()
		if err != nil {
			return resets, fmt.Errorf("claim: reset %s: %w", t.Task, err)
		}
		if !resp.Succeeded {
			return resets, fmt.Errorf("%w: resetting %s", ErrFenced, t.Task)
		}
		if resp.Responses[0].GetResponseTxn().Succeeded {
			resets = append(resets, Reset{Task: t.Task, Was: t.Record, Why: why})
		}
	}
	return resets, nil
}

// updateAsHolder is the read-modify-write of a change only the claim
// holder may make: f computes the new record (or says there is nothing to
// write), and the write compares both the record's ModRevision and the
// claim key. A changed record is read again; a claim not ours is
// ErrNotHolder.
func updateAsHolder(ctx context.Context, cli *clientv3.Client, a Attempt, f func(Record) (Record, bool, error)) (Record, error) {
	if err := a.Task.validate(); err != nil {
		return Record{}, err
	}
	key, claimKey := a.Task.RecordKey(), a.Task.ClaimKey()
	cur, found, err := getRecord(ctx, cli, a.Task)
	if err != nil {
		return Record{}, err
	}
	for range casAttemptsMax {
		if !found {
			return Record{}, fmt.Errorf("%w: %s", ErrNoTask, a.Task)
		}
		next, write, err := f(cur)
		if err != nil || !write {
			return next, err
		}
		val, err := encodeRecord(next)
		if err != nil {
			return Record{}, err
		}
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision),
				clientv3.Compare(clientv3.CreateRevision(claimKey), "=", int64(a.Epoch)),
				clientv3.Compare(clientv3.Value(claimKey), "=", a.Executor)).
			Then(clientv3.OpPut(key, val)).
			Else(clientv3.OpGet(key), clientv3.OpGet(claimKey)).
			Commit()
		if err != nil {
			return Record{}, fmt.Errorf("claim: update %s: %w", a.Task, err)
		}
		if resp.Succeeded {
			next.ModRevision = resp.Header.Revision
			return next, nil
		}
		// Find which compare failed from the Else reads, taken atomically
		// with the compares.
		claimKVs := resp.Responses[1].GetResponseRange().Kvs
		var claimKV *mvccpb.KeyValue
		if len(claimKVs) == 1 {
			claimKV = claimKVs[0]
		}
		if claimKV == nil || uint64(claimKV.CreateRevision) != a.Epoch || string(claimKV.Value) != a.Executor {
			return Record{}, fmt.Errorf("%w: claim of %s at epoch %d is no longer %s's", ErrNotHolder, a.Task, a.Epoch, a.Executor)
		}
		recKVs := resp.Responses[0].GetResponseRange().Kvs
		if found = len(recKVs) == 1; found {
			if cur, err = decodeRecord(recKVs[0]); err != nil {
				return Record{}, err
			}
		}
	}
	return Record{}, fmt.Errorf("%w: updating %s", ErrContention, a.Task)
}

func getRecord(ctx context.Context, cli *clientv3.Client, task Task) (Record, bool, error) {
	resp, err := cli.Get(ctx, task.RecordKey())
	if err != nil {
		return Record{}, false, fmt.Errorf("claim: read task %s: %w", task, err)
	}
	if len(resp.Kvs) == 0 {
		return Record{}, false, nil
	}
	rec, err := decodeRecord(resp.Kvs[0])
	return rec, err == nil, err
}

func encodeRecord(r Record) (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("claim: encode task record: %w", err)
	}
	return string(b), nil
}

// decodeRecord refuses what no writer stores: a record without a status
// (a JSON null or {}) would otherwise reach the status moves, which treat
// an unknown status as this package's own bug.
func decodeRecord(kv *mvccpb.KeyValue) (Record, error) {
	var r Record
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return Record{}, fmt.Errorf("claim: corrupt task record %q: %w", kv.Key, err)
	}
	if r.Status < StatusPending || r.Status > StatusFailed {
		return Record{}, fmt.Errorf("claim: corrupt task record %q: no status", kv.Key)
	}
	// The writers store UTC; a zone offset JSON reads but cannot write
	// back (24 hours) must not make the record unwritable.
	r.UpdatedAt = normalize(r.UpdatedAt)
	r.Opened, r.ModRevision = uint64(kv.CreateRevision), kv.ModRevision
	return r, nil
}

// listPrefix reads every key under prefix at revision rev (0: the current
// one, returned), a page at a time, at most TasksMax keys.
func listPrefix(ctx context.Context, cli *clientv3.Client, prefix string, rev int64) ([]*mvccpb.KeyValue, int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	var kvs []*mvccpb.KeyValue
	for range TasksMax/listPageKeys + 1 {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPageKeys)}
		if rev != 0 {
			// Every page from the first page's revision: one consistent view.
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(ctx, from, opts...)
		if err != nil {
			return nil, 0, fmt.Errorf("claim: list %s: %w", prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		kvs = append(kvs, resp.Kvs...)
		if !resp.More || len(resp.Kvs) == 0 {
			return kvs, rev, nil
		}
		if len(kvs) > TasksMax {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return nil, 0, fmt.Errorf("claim: more than %d keys under %s", TasksMax, prefix)
}

// normalize drops the monotonic reading and the zone of a time passed in,
// so a record written equals the same record read back.
func normalize(t time.Time) time.Time { return t.Round(0).UTC() }
