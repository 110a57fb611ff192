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

// Incarnate records a new start of node at now and returns its
// incarnation: the count is raised by one in a compare-and-swap on the
// key's ModRevision (created with count 1 if absent), so two processes
// starting as the same node never get the same count.
func Incarnate(ctx context.Context, cli *clientv3.Client, node string, now time.Time) (Incarnation, error) {
	if err := checkID("node id", node, nodeIDBytesMax); err != nil {
		return Incarnation{}, err
	}
	key := IncarnationKey(node)
	for range incarnateTriesMax {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			return Incarnation{}, fmt.Errorf("supervise: read incarnation of %s: %w", node, err)
		}
		next := Incarnation{Node: node, Count: 1, Started: normalize(now)}
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if len(resp.Kvs) == 1 {
			cur, err := decodeIncarnation(resp.Kvs[0])
			if err != nil {
				return Incarnation{}, err
			}
			if cur.Count == math.MaxUint64 {
				return Incarnation{}, fmt.Errorf("%w: incarnation of %s: count at its maximum", ErrCorrupt, node)
			}
			next.Count = cur.Count + 1
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", cur.ModRevision)
		}
		val, err := encode(next)
		if err != nil {
			return Incarnation{}, err
		}
		tx, err := cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, val)).Commit()
		if err != nil {
			return Incarnation{}, fmt.Errorf("supervise: record incarnation of %s: %w", node, err)
		}
		if tx.Succeeded {
			next.ModRevision = tx.Header.Revision
			return next, nil
		}
	}
	return Incarnation{}, fmt.Errorf("supervise: incarnation of %s: lost %d races for the key", node, incarnateTriesMax)
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
