package supervise

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrProcessRunning: another process of the node id is registered and alive.
// A start under the same id would supersede it (ErrSuperseded), and it
// would stop.
var ErrProcessRunning = errors.New("supervise: another process of the node is running")

// expirySlack is what WaitNotRunning waits past a record's lease for
// etcd to delete it: etcd revokes expired leases in a sweep, not at the
// instant.
const expirySlack = 3 * time.Second

// WaitNotRunning returns nil once no other live process holds node id's
// record, ErrProcessRunning (wrapped, naming it) if one does. prevStart is when
// the caller's data directory last started a process (zero if never): a
// record of that process is replaced at once, as the caller holds the
// directory's lock and so that process is gone. Any other record is
// watched until it is deleted (its lease expired: the process is dead or
// stopped) or its process writes it again (an activity update: it is
// alive), for at most the lease's remaining TTL and expirySlack. A
// health mark (not-responding), written by the supervisor, says neither.
func WaitNotRunning(ctx context.Context, cli *clientv3.Client, id string, prevStart time.Time) error {
	key := NodeKey(id)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("supervise: read node %s's record: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	rec, err := decodeNode(resp.Kvs[0])
	if err != nil {
		return nil // Register replaces an unreadable record, and says so
	}
	// The data directory keeps its start in milliseconds.
	if !prevStart.IsZero() && rec.Started.UnixMilli() == prevStart.UnixMilli() {
		return nil
	}
	running := func(why string) error {
		return fmt.Errorf("%w: node %s is registered by a process started %s at %s, %s", ErrProcessRunning, id,
			rec.Started.Format(time.RFC3339), rec.Address, why)
	}
	wait := expirySlack
	if rec.Lease != 0 {
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(rec.Lease))
		if err != nil {
			return fmt.Errorf("supervise: read the lease of node %s's record: %w", id, err)
		}
		wait += time.Duration(max(ttl.TTL, 0)) * time.Second
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	wch := cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("supervise: watch node %s's record: %w", id, err)
		}
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
			now, err := decodeNode(ev.Kv)
			switch {
			case err != nil:
				return running("and its record was rewritten unreadable")
			case !now.Started.Equal(rec.Started):
				rec = now
				return running("which registered meanwhile")
			case now.LastActive.After(rec.LastActive):
				return running(fmt.Sprintf("active %s", now.LastActive.Format(time.RFC3339Nano)))
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return running(fmt.Sprintf("its record neither updated nor expired within %s", wait.Round(time.Second)))
}
