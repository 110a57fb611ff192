package supervise

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// Assignments is one node's copy of the assignments naming it as source,
// kept current by a watch: ListAssignments, then WatchAssignments from
// Rev, and Apply for each event. A node's assignment loop took its
// assignments by reading them all every 100 ms; with the copy it reads
// them once, and takes a new one as its event arrives.
type Assignments struct {
	Node string
	// Rev is the etcd revision the copy is at.
	Rev  int64
	mine map[claim.Task]Assignment
}

// ListAssignments reads every assignment and keeps those naming node.
func ListAssignments(ctx context.Context, cli *clientv3.Client, node string) (*Assignments, error) {
	kvs, rev, err := rangeAt(ctx, cli, assignPrefix, 0)
	if err != nil {
		return nil, err
	}
	s := &Assignments{Node: node, Rev: rev, mine: map[claim.Task]Assignment{}}
	for _, kv := range kvs {
		a, err := decodeAssignment(kv)
		if err != nil {
			return nil, err
		}
		if a.Source == node {
			s.mine[a.Task] = a
		}
	}
	return s, nil
}

// WatchAssignments watches the assignments from the revision after rev.
// It ends when ctx does, and with an error when etcd compacted past rev
// (list again). ctx should carry clientv3.WithRequireLeader, so that a
// member cut off from its cluster ends the watch instead of going
// silent.
func WatchAssignments(ctx context.Context, cli *clientv3.Client, rev int64) clientv3.WatchChan {
	return cli.Watch(ctx, assignPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
}

// Apply applies one event of the watch: an assignment naming the node is
// kept, one naming another node or deleted is dropped. An event at or
// below Rev changes nothing. A record that does not decode is an error
// and changes nothing.
func (s *Assignments) Apply(ev *clientv3.Event) error {
	kv := ev.Kv
	if kv.ModRevision <= s.Rev {
		return nil
	}
	if ev.Type == mvccpb.DELETE {
		p, dest, err := parseRecordKey(kv.Key, assignPrefix)
		if err != nil {
			return err
		}
		delete(s.mine, claim.Task{Partition: p, Dest: dest})
		s.Rev = kv.ModRevision
		return nil
	}
	a, err := decodeAssignment(kv)
	if err != nil {
		return err
	}
	if a.Source == s.Node {
		s.mine[a.Task] = a
	} else {
		delete(s.mine, a.Task)
	}
	s.Rev = kv.ModRevision
	return nil
}

// Mine returns the assignments naming the node, in task order.
func (s *Assignments) Mine() []Assignment {
	out := slices.Collect(maps.Values(s.mine))
	slices.SortFunc(out, func(x, y Assignment) int {
		return cmp.Or(cmp.Compare(x.Task.Partition, y.Task.Partition), cmp.Compare(x.Task.Dest, y.Task.Dest))
	})
	return out
}
