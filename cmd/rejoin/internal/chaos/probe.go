package chaos

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/wire"
)

// probes write one key of each partition, each partition on its own, so
// that the availability figures say whether a partition served, not
// whether the workloads' callers were free to ask it: the volume writer
// and the register callers are closed loops over every partition, and
// under a fault that stalls some partitions every one of them soon waits
// on a stalled one, so a partition the fault never touched went without
// a successful op as long as the others (chaos seed 29597381: 2.1 s gaps
// over a node's stop in partitions it held no replica of). A probe sends
// one call at a time through one node, bounded by probeTimeout, and on a
// failure goes on through the next node, as a client of the whole
// cluster would: the partition's holders first, in the order the client
// (recovery/client) tries them, then the others (probeNext).
type probes struct {
	l      *lanes
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// fails keeps each partition's last failed probe calls (at most
	// probeFailsMax), which the summary lists under a gap past its bound:
	// a gap says how long, its failures say where the calls stopped.
	mu    sync.Mutex
	fails map[uint32][]probeFail
}

// probeFail is one failed probe call: when it ended (from the workloads'
// start), through which node, and why.
type probeFail struct {
	at   time.Duration
	node int
	err  string
}

// probeFailsMax bounds probes.fails per partition: 10 minutes of a probe
// failing every 260 ms is about 2,300.
const probeFailsMax = 4096

// probeEvery is the pause after a probe's success; probeTimeout bounds
// one call, after which the probe goes to the next node. A gap of a
// partition with a live replica and a node that answers is then at most
// about probeEvery plus a call; one through a stalled node adds
// probeTimeout.
const (
	probeEvery   = 50 * time.Millisecond
	probeTimeout = 250 * time.Millisecond
	// probeRetryPause follows a failed call.
	probeRetryPause = 10 * time.Millisecond
)

// probeKeysMax bounds the search for a key of each partition.
const probeKeysMax = 1 << 16

// startProbes starts a probe of each partition 0..partitions-1 through
// l's clients, each success told to l.done.
func startProbes(ctx context.Context, l *lanes, partitions uint32) (*probes, error) {
	keys := make([]wire.Value, partitions)
	have := make([]bool, partitions)
	found := uint32(0)
	for i := 0; i < probeKeysMax && found < partitions; i++ {
		k := wire.Bytes([]byte("chaos-probe-" + strconv.Itoa(i)))
		if p := l.cs[0].Partition(k); p < partitions && !have[p] {
			keys[p], have[p] = k, true
			found++
		}
	}
	if found < partitions {
		return nil, fmt.Errorf("chaos: no probe key for %d of %d partitions within %d tries", partitions-found, partitions, probeKeysMax)
	}
	pr := &probes{l: l, fails: map[uint32][]probeFail{}}
	ctx, pr.cancel = context.WithCancel(ctx)
	for p := range partitions {
		pr.wg.Go(func() { pr.run(ctx, p, keys[p]) })
	}
	return pr, nil
}

func (pr *probes) run(ctx context.Context, p uint32, key wire.Value) {
	at := int(p) % len(pr.l.cs)
	// failed are the nodes failed since the last success.
	failed := make([]bool, len(pr.l.cs))
	for seq := 0; ctx.Err() == nil; seq++ {
		cctx, cancel := context.WithTimeout(ctx, probeTimeout)
		_, err := pr.l.cs[at].Upsert(cctx, volumeTable, key, wire.Bytes([]byte(strconv.Itoa(seq))))
		cancel()
		if err == nil {
			clear(failed)
			pr.l.done.add(p, time.Now())
			if !sleepCtx(ctx, probeEvery) {
				return
			}
			continue
		}
		pr.noteFail(p, at+1, err)
		failed[at] = true
		at = probeNext(pr.l.cs[at].Holders(p), failed, at)
		// A quick refusal (a node not registered yet) must not spin.
		if !sleepCtx(ctx, probeRetryPause) {
			return
		}
	}
}

// noteFail records a failed call of partition p's probe through node.
func (pr *probes) noteFail(p uint32, node int, err error) {
	f := probeFail{at: time.Since(pr.l.done.t0), node: node, err: err.Error()}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	fs := pr.fails[p]
	if len(fs) >= probeFailsMax {
		fs = append(fs[:0], fs[len(fs)/2:]...)
	}
	pr.fails[p] = append(fs, f)
}

// failsIn returns the failures of partition p's probe within [from, to]
// (seconds from the workloads' start), as "n<node> x<count>: <error>",
// each distinct node and error once, in the order first seen, at most
// max.
func (pr *probes) failsIn(p uint32, from, to float64, max int) []string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	type key struct {
		node int
		err  string
	}
	counts := map[key]int{}
	var order []key
	for _, f := range pr.fails[p] {
		if s := f.at.Seconds(); s < from || s > to {
			continue
		}
		k := key{f.node, f.err}
		if len(k.err) > probeErrBytesMax {
			k.err = k.err[:probeErrBytesMax] + "..."
		}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	var out []string
	for _, k := range order {
		if len(out) == max {
			out = append(out, fmt.Sprintf("... %d more", len(order)-max))
			break
		}
		out = append(out, fmt.Sprintf("n%d x%d: %s", k.node, counts[k], k.err))
	}
	return out
}

// probeErrBytesMax bounds one error as failsIn gives it.
const probeErrBytesMax = 200

// stop ends the probes and waits for them.
func (pr *probes) stop() {
	pr.cancel()
	pr.wg.Wait()
}

// probeNext is the lane a probe tries after a failure: the first of the
// partition's holders (nodes "n1".. as lanes 0..), in the client's
// order, that has not failed since the last success, else the first
// other node after at that has not; once every node has failed, the
// round starts again (failed cleared) from the holders. A client of the
// whole cluster goes where the partition lives: going round every node
// in a fixed order instead, a probe met two stalled nodes that hold no
// replica of its partition one after the other, 250 ms each, and the
// partition, served throughout, counted 0.57 s without a successful op
// (chaos seeds 20261206 and 20261207).
func probeNext(holders []string, failed []bool, at int) int {
	n := len(failed)
	names := laneNames(n)
	var order []int
	for _, h := range holders {
		if i := slices.Index(names, h); i >= 0 {
			order = append(order, i)
		}
	}
	for k := 1; k <= n; k++ {
		order = append(order, (at+k)%n)
	}
	for _, i := range order {
		if !failed[i] {
			return i
		}
	}
	clear(failed)
	return order[0]
}

// laneNames are the node names of lanes 0..n-1 (openLanes).
func laneNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = node.NodeName(i + 1)
	}
	return names
}
