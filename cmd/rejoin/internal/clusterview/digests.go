package clusterview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// digestFanout bounds the partitions asked at once.
const digestFanout = 16

// DigestReport is the outcome of asking every replica of every partition
// for its digest inside one read-only txn per partition: all replicas of a
// partition answer at the same txn ID.
type DigestReport struct {
	Partitions []PartitionDigests `json:"partitions"`
	// ReplicasChecked counts the replica answers that carried a digest.
	ReplicasChecked int `json:"replicas_checked"`
	// Bad names the partitions that mismatch, failed or answered short.
	Bad []uint32 `json:"bad,omitempty"`
}

// Differ reports whether some partition's replicas answered different
// digests: a real mismatch, unlike a partition that answered short.
func (r DigestReport) Differ() bool {
	for _, p := range r.Partitions {
		if p.Differ {
			return true
		}
	}
	return false
}

// OK reports whether every partition matched.
func (r DigestReport) OK() bool { return len(r.Bad) == 0 && len(r.Partitions) > 0 }

// Unread lists the partitions that are bad without a difference: no
// digest to compare came back (no node reached, a replica's error, fewer
// answers than live replicas). Nothing is known of them; they are not a
// mismatch.
func (r DigestReport) Unread() []uint32 {
	var out []uint32
	for _, p := range r.Partitions {
		if !p.Match && !p.Differ {
			out = append(out, p.Partition)
		}
	}
	return out
}

// PartitionDigests is one partition's answers.
type PartitionDigests struct {
	Partition uint32 `json:"partition"`
	// TxnID is the digest txn's ID: the common point of every answer.
	TxnID txnid.ID `json:"txn_id"`
	// Live is how many replicas etcd says are live (on a live node).
	Live     int             `json:"live"`
	Replicas []ReplicaDigest `json:"replicas"`
	Match    bool            `json:"match"`
	// Differ: two replicas answered different digests or row counts at
	// the common txn ID. A partition not Match but not Differ failed to
	// answer fully (an error, fewer answers than live replicas), which
	// may pass when asked again.
	Differ bool `json:"differ,omitempty"`
	// Problem says why the partition is not Match.
	Problem string `json:"problem,omitempty"`
}

// ReplicaDigest is one replica's answer.
type ReplicaDigest struct {
	Node   string `json:"node"`
	Digest uint64 `json:"digest"`
	Rows   int64  `json:"rows"`
	Err    string `json:"err,omitempty"`
}

// Answer is one partition's raw outcome: the txn ID and each replica's
// (digest, rows) or error; Err if the call itself failed.
type Answer struct {
	ID   txnid.ID
	Each []client.ReplicaResult
	Err  error
}

// CheckDigests calls the digest procedure on every partition (CallEach)
// and evaluates the answers against the live replicas in etcd.
func CheckDigests(ctx context.Context, cli *clientv3.Client, c *client.Client) (DigestReport, error) {
	live, err := LiveReplicas(ctx, cli)
	if err != nil {
		return DigestReport{}, err
	}
	answers := make(map[uint32]Answer, c.Partitions())
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, digestFanout)
	for p := range c.Partitions() {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return DigestReport{}, ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			res, err := c.CallEach(ctx, p, client.ProcDigest, nil)
			// A replica etcd has live may not be in the answering node's
			// view yet (it reads the membership every 100 ms): a call
			// then waits for fewer replicas. Ask again, a few polls'
			// worth, before counting it; a digest that differs is never
			// asked again.
			for try := 0; err == nil && len(res.Each) < live[p] && try < digestRetries; try++ {
				select {
				case <-time.After(digestRetryEvery):
				case <-ctx.Done():
				}
				if ctx.Err() != nil {
					break
				}
				res, err = c.CallEach(ctx, p, client.ProcDigest, nil)
			}
			mu.Lock()
			defer mu.Unlock()
			answers[p] = Answer{ID: res.ID, Each: res.Each, Err: err}
		})
	}
	wg.Wait()
	return EvaluateDigests(c.Partitions(), answers, live), nil
}

// digestRetries and digestRetryEvery bound the asking again of a
// partition that fewer replicas answered than etcd has live.
const (
	digestRetries    = 10
	digestRetryEvery = 150 * time.Millisecond
)

// LiveReplicas counts, per partition, the replicas placed live on a
// registered node.
func LiveReplicas(ctx context.Context, cli *clientv3.Client) (map[uint32]int, error) {
	nodes, err := supervise.Nodes(ctx, cli)
	if err != nil {
		return nil, err
	}
	alive := map[string]bool{}
	for _, n := range nodes {
		alive[n.ID] = true
	}
	reps, err := supervise.Replicas(ctx, cli)
	if err != nil {
		return nil, err
	}
	live := map[uint32]int{}
	for _, r := range reps {
		if r.State == recovery.ReplicaLive && alive[r.Node] {
			live[r.Partition]++
		}
	}
	return live, nil
}

// EvaluateDigests is the pure part of CheckDigests: a partition matches
// when the call succeeded, at least as many replicas answered as are live,
// none failed, and all digests and row counts are equal.
func EvaluateDigests(partitions uint32, answers map[uint32]Answer, live map[uint32]int) DigestReport {
	var rep DigestReport
	for p := range partitions {
		a, ok := answers[p]
		pd := PartitionDigests{Partition: p, TxnID: a.ID, Live: live[p]}
		var problems []string
		switch {
		case !ok:
			problems = append(problems, "not asked")
		case a.Err != nil:
			problems = append(problems, a.Err.Error())
		}
		for _, e := range a.Each {
			rd := ReplicaDigest{Node: e.Node, Err: e.Err}
			if e.Err == "" {
				if len(e.Out) != 2 || e.Out[0].Type != wire.TypeInt64 || e.Out[1].Type != wire.TypeInt64 {
					rd.Err = fmt.Sprintf("unexpected digest answer %v", e.Out)
				} else {
					rd.Digest, rd.Rows = uint64(e.Out[0].Int), e.Out[1].Int
					rep.ReplicasChecked++
				}
			}
			if rd.Err != "" {
				problems = append(problems, fmt.Sprintf("%s: %s", e.Node, rd.Err))
			}
			pd.Replicas = append(pd.Replicas, rd)
		}
		slices.SortFunc(pd.Replicas, func(x, y ReplicaDigest) int { return cmpNodeID(x.Node, y.Node) })
		if ok && a.Err == nil {
			if len(pd.Replicas) < pd.Live || len(pd.Replicas) == 0 {
				problems = append(problems, fmt.Sprintf("%d answers, %d live replicas", len(pd.Replicas), pd.Live))
			}
			for _, r := range pd.Replicas[min(1, len(pd.Replicas)):] {
				first := pd.Replicas[0]
				if r.Err == "" && first.Err == "" && (r.Digest != first.Digest || r.Rows != first.Rows) {
					pd.Differ = true
					problems = append(problems, fmt.Sprintf("%s has %016x over %d rows, %s has %016x over %d rows",
						first.Node, first.Digest, first.Rows, r.Node, r.Digest, r.Rows))
				}
			}
		}
		pd.Match = len(problems) == 0
		if !pd.Match {
			pd.Problem = errors.Join(errorsOf(problems)...).Error()
			rep.Bad = append(rep.Bad, p)
		}
		rep.Partitions = append(rep.Partitions, pd)
	}
	return rep
}

func errorsOf(ss []string) []error {
	out := make([]error, len(ss))
	for i, s := range ss {
		out[i] = errors.New(s)
	}
	return out
}

// RenderDigests prints one line per replica answer, grouped by partition.
func RenderDigests(w io.Writer, r DigestReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tTXN\tNODE\tDIGEST\tROWS\tRESULT")
	for _, p := range r.Partitions {
		result := "match"
		switch {
		case p.Differ:
			result = "MISMATCH: " + p.Problem
		case !p.Match:
			result = "NOT COMPARED: " + p.Problem
		}
		if len(p.Replicas) == 0 {
			fmt.Fprintf(tw, "%d\t%s\t-\t-\t-\t%s\n", p.Partition, p.TxnID, result)
		}
		for i, rd := range p.Replicas {
			digest, rows := fmt.Sprintf("%016x", rd.Digest), fmt.Sprint(rd.Rows)
			if rd.Err != "" {
				digest, rows = "error", "-"
			}
			res := ""
			if i == 0 {
				res = result
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", p.Partition, p.TxnID, rd.Node, digest, rows, res)
		}
	}
	return tw.Flush()
}
