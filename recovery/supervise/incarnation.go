package supervise

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// incarnationsPrefix holds the incarnation records (see doc.go's key
// layout).
const incarnationsPrefix = keyRoot + "incarnations/"

// incarnateTriesMax bounds Incarnate's compare-and-swap retries: only two
// processes of one node id starting at once race on the key.
const incarnateTriesMax = 8

// Incarnation is the cluster's record of how many times a node has
// started, as JSON under IncarnationKey, without a lease: it outlives
// every process and every data directory of the node. Count 1 is the
// node's first start in this cluster, the only one whose replicas may
// start live (DESIGN.md, "Incarnations and fencing"): a replica is in
// memory, so any later start holds nothing, whatever its data directory
// says.
//
// Invariant: Count only grows, by one per Incarnate, and is at least 1.
type Incarnation struct {
	Node  string `json:"-"`
	Count uint64 `json:"count"`
	// Started is when the incarnation began, by the node's clock.
	Started time.Time `json:"started"`

	ModRevision int64 `json:"-"`
}

// First reports whether this is the node's first start in the cluster.
func (i Incarnation) First() bool { return i.Count == 1 }

// IncarnationKey is the etcd key of a node's incarnation record.
func IncarnationKey(node string) string { return incarnationsPrefix + node }

// Started is what Incarnate returns: the node's new incarnation, and
// whether the cluster was bootstrapped before it.
type Started struct {
	Incarnation
	// Bootstrapped: before this start, every node of the placement had
	// started at least once, so the cluster may have taken writes (see
	// Bootstrapped). A replica may start live only when it was not: until
	// then no write was taken anywhere, and every copy is empty.
	Bootstrapped bool
}

// Incarnate records a new start of node at now and returns its
// incarnation: the count is raised by one in a compare-and-swap (created
// with count 1 if absent), so two processes starting as the same node
// never get the same count. placed lists the nodes of the placement; the
// write is conditional on no incarnation record having changed since they
// were read, so Bootstrapped is decided at the same revision as the count.
func Incarnate(ctx context.Context, cli *clientv3.Client, node string, placed []string, now time.Time) (Started, error) {
	if err := checkID("node id", node, nodeIDBytesMax); err != nil {
		return Started{}, err
	}
	key := IncarnationKey(node)
	for range incarnateTriesMax {
		all, rev, err := incarnations(ctx, cli)
		if err != nil {
			return Started{}, err
		}
		next := Incarnation{Node: node, Count: 1, Started: normalize(now)}
		if cur, ok := all[node]; ok {
			if cur.Count == math.MaxUint64 {
				return Started{}, fmt.Errorf("%w: incarnation of %s: count at its maximum", ErrCorrupt, node)
			}
			next.Count = cur.Count + 1
		}
		val, err := encode(next)
		if err != nil {
			return Started{}, err
		}
		// No record under the prefix changed since the read: neither ours
		// (another process of this node) nor another node's first start.
		unchanged := clientv3.Compare(clientv3.ModRevision(incarnationsPrefix), "<", rev+1).WithPrefix()
		tx, err := cli.Txn(ctx).If(unchanged).Then(clientv3.OpPut(key, val)).Commit()
		if err != nil {
			return Started{}, fmt.Errorf("supervise: record incarnation of %s: %w", node, err)
		}
		if tx.Succeeded {
			next.ModRevision = tx.Header.Revision
			return Started{Incarnation: next, Bootstrapped: bootstrapped(all, placed)}, nil
		}
	}
	return Started{}, fmt.Errorf("supervise: incarnation of %s: lost %d races for the key", node, incarnateTriesMax)
}

// Bootstrapped reports whether every node of placed has started at least
// once. Until then the nodes take no client call (recovery/node), so
// every replica of the cluster is empty and equal, and a node that starts
// (again) may bring its replicas up live; from then on a replica that
// starts holds nothing that the others hold, and must rejoin.
func Bootstrapped(ctx context.Context, cli *clientv3.Client, placed []string) (bool, error) {
	all, _, err := incarnations(ctx, cli)
	if err != nil {
		return false, err
	}
	return bootstrapped(all, placed), nil
}

func bootstrapped(all map[string]Incarnation, placed []string) bool {
	if _, ok := all[markNode]; ok {
		return true
	}
	for _, node := range placed {
		if _, ok := all[node]; !ok {
			return false
		}
	}
	return true
}

// incarnations reads every incarnation record, at one revision.
//
// The bootstrap mark (BootstrappedKey) is read at the same revision and
// counts as an incarnation record of every node: once a cluster has
// bootstrapped it stays so, even when a node that never started joins the
// placement (Replace).
func incarnations(ctx context.Context, cli *clientv3.Client) (map[string]Incarnation, int64, error) {
	tx, err := cli.Txn(ctx).Then(
		clientv3.OpGet(incarnationsPrefix, clientv3.WithPrefix(), clientv3.WithLimit(snapshotKeysMax+1)),
		clientv3.OpGet(BootstrappedKey, clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("supervise: read incarnations: %w", err)
	}
	resp, mark := tx.Responses[0].GetResponseRange(), tx.Responses[1].GetResponseRange()
	if resp == nil || mark == nil {
		return nil, 0, fmt.Errorf("%w: read incarnations: a range answer missing", ErrCorrupt)
	}
	if len(resp.Kvs) > snapshotKeysMax {
		return nil, 0, fmt.Errorf("%w: more than %d incarnation records", ErrCorrupt, snapshotKeysMax)
	}
	all := make(map[string]Incarnation, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		inc, err := decodeIncarnation(kv)
		if err != nil {
			return nil, 0, err
		}
		all[inc.Node] = inc
	}
	if mark.Count > 0 {
		all[markNode] = Incarnation{Node: markNode, Count: 1}
	}
	return all, tx.Header.Revision, nil
}

func decodeIncarnation(kv *mvccpb.KeyValue) (Incarnation, error) {
	var i Incarnation
	if err := json.Unmarshal(kv.Value, &i); err != nil {
		return Incarnation{}, fmt.Errorf("%w: incarnation %q: %w", ErrCorrupt, kv.Key, err)
	}
	id, ok := bytes.CutPrefix(kv.Key, []byte(incarnationsPrefix))
	if !ok {
		return Incarnation{}, fmt.Errorf("%w: incarnation key %q", ErrCorrupt, kv.Key)
	}
	if err := checkID("node id", string(id), nodeIDBytesMax); err != nil {
		return Incarnation{}, fmt.Errorf("%w: incarnation key %q: %w", ErrCorrupt, kv.Key, err)
	}
	if i.Count == 0 {
		return Incarnation{}, fmt.Errorf("%w: incarnation %q: count 0", ErrCorrupt, kv.Key)
	}
	i.Node = string(id)
	i.Started = normalize(i.Started)
	i.ModRevision = kv.ModRevision
	return i, nil
}
