package supervise

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Membership is what a node follows of the cluster: the registered nodes
// and the placement with each replica's state, as of revision Rev. It is
// listed once (ListMembership) and then kept by a watch's events
// (WatchMembership, Apply), so that following it costs the changes, not
// the records: a cluster of 4096 partitions x 3 replicas holds 12,288
// replica records, which a list every 100 ms per node could not read in
// time.
//
// Invariant: Nodes and Replicas are the records under their prefixes at
// revision Rev; an event below Rev is already in them, and so is one at
// Rev, though another event of Rev may not be yet: the records of one
// etcd transaction share its revision and come as several events.
type Membership struct {
	Rev   int64
	Nodes map[string]NodeRecord
	// Replicas are keyed by ReplicaKey.
	Replicas map[string]Replica
	// Reports are keyed by ReportKey, Fences by node (fence.go).
	Reports map[string]Report
	Fences  map[string]Fence
}

// ListMembership reads the node and replica records at one revision.
func ListMembership(ctx context.Context, cli *clientv3.Client) (*Membership, error) {
	nodes, rev, err := rangeAt(ctx, cli, nodesPrefix, 0)
	if err != nil {
		return nil, err
	}
	reps, _, err := rangeAt(ctx, cli, replicasPrefix, rev)
	if err != nil {
		return nil, err
	}
	m := &Membership{Rev: rev, Nodes: make(map[string]NodeRecord, len(nodes)), Replicas: make(map[string]Replica, len(reps))}
	for _, kv := range nodes {
		n, err := decodeNode(kv)
		if err != nil {
			return nil, err
		}
		m.Nodes[n.ID] = n
	}
	for _, kv := range reps {
		r, err := decodeReplica(kv)
		if err != nil {
			return nil, err
		}
		m.Replicas[string(kv.Key)] = r
	}
	if err := m.listOut(ctx, cli); err != nil {
		return nil, err
	}
	return m, nil
}

// WatchMembership watches the node and replica records, and the reports
// and fences between them, from the revision after rev, in one stream
// (the prefixes are one key range, nothing else lies between them), so
// events come in revision order. The watch
// ends when ctx does, and with an error when etcd compacted past rev
// (list again). ctx should carry clientv3.WithRequireLeader, so that a
// member cut off from its cluster ends the watch instead of going silent.
func WatchMembership(ctx context.Context, cli *clientv3.Client, rev int64) clientv3.WatchChan {
	return cli.Watch(ctx, nodesPrefix, clientv3.WithRange(clientv3.GetPrefixRangeEnd(replicasPrefix)), clientv3.WithRev(rev+1))
}

// Apply applies one event of a membership watch. It reports whether the
// nodes (the set of ids or a record) or the replicas changed; an event
// below Rev, or of a key of neither prefix, changes nothing. An event at
// Rev is applied: it may be the next record of the transaction whose
// first record moved Rev there, and if it is already in the records
// (etcd changes a key at most once per revision) it changes nothing. A
// record that does not decode is an error and changes nothing.
func (m *Membership) Apply(ev *clientv3.Event) (nodes, replicas bool, err error) {
	kv := ev.Kv
	if kv.ModRevision < m.Rev {
		return false, false, nil
	}
	key := string(kv.Key)
	switch {
	case strings.HasPrefix(key, nodesPrefix):
		if ev.Type == mvccpb.DELETE {
			id := strings.TrimPrefix(key, nodesPrefix)
			_, had := m.Nodes[id]
			delete(m.Nodes, id)
			nodes = had
			break
		}
		n, err := decodeNode(kv)
		if err != nil {
			return false, false, err
		}
		old, had := m.Nodes[n.ID]
		m.Nodes[n.ID], nodes = n, !had || old != n
	case strings.HasPrefix(key, replicasPrefix):
		if ev.Type == mvccpb.DELETE {
			_, had := m.Replicas[key]
			delete(m.Replicas, key)
			replicas = had
			break
		}
		r, err := decodeReplica(kv)
		if err != nil {
			return false, false, err
		}
		replicas = m.Replicas[key] != r
		m.Replicas[key] = r
	case strings.HasPrefix(key, outPrefix):
		if m.Reports == nil {
			m.Reports, m.Fences = map[string]Report{}, map[string]Fence{}
		}
		changed, err := m.applyOut(ev)
		if err != nil {
			return false, false, err
		}
		nodes = changed
	}
	m.Rev = kv.ModRevision
	return nodes, replicas, nil
}

// rangeAt is rangeAll at revision rev (0: the latest), returning the
// revision read.
func rangeAt(ctx context.Context, cli *clientv3.Client, prefix string, rev int64) ([]*mvccpb.KeyValue, int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	var out []*mvccpb.KeyValue
	for range snapshotKeysMax/snapshotPageKeys + 1 {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(snapshotPageKeys)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(ctx, from, opts...)
		if err != nil {
			return nil, 0, fmt.Errorf("supervise: list %s: %w", prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		out = append(out, resp.Kvs...)
		if !resp.More || len(resp.Kvs) == 0 {
			return slices.Clip(out), rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	return nil, 0, fmt.Errorf("supervise: more than %d keys under %s", snapshotKeysMax, prefix)
}
