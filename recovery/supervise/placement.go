package supervise

import (
	"errors"
	"fmt"
	"slices"
)

// ErrPlacement: a placement cannot be made as asked.
var ErrPlacement = errors.New("supervise: placement")

// Place spreads partitions [0, partitions) over nodes, replicas copies of
// each on distinct nodes. It is deterministic (the same nodes, in any
// order, give the same placement) and balanced: each partition takes the
// least loaded nodes, so every node hosts partitions*replicas/len(nodes)
// replicas, rounded up or down. The result is what a cluster is created
// with; SetReplica records it.
func Place(nodes []string, partitions uint32, replicas int) (map[uint32][]string, error) {
	sorted := slices.Clone(nodes)
	slices.Sort(sorted)
	switch {
	case len(sorted) == 0:
		return nil, fmt.Errorf("%w: no nodes", ErrPlacement)
	case slices.Contains(sorted, ""):
		return nil, fmt.Errorf("%w: empty node id", ErrPlacement)
	case len(slices.Compact(slices.Clone(sorted))) != len(sorted):
		return nil, fmt.Errorf("%w: node ids repeat: %v", ErrPlacement, sorted)
	case partitions == 0:
		return nil, fmt.Errorf("%w: no partitions", ErrPlacement)
	case replicas < 1 || replicas > len(sorted):
		return nil, fmt.Errorf("%w: %d replicas on %d nodes; want 1..%d, each on its own node", ErrPlacement, replicas, len(sorted), len(sorted))
	}
	n := len(sorted)
	load := make([]int, n)
	order := make([]int, n)
	out := make(map[uint32][]string, partitions)
	for p := range partitions {
		// The least loaded nodes, ties broken by distance from p in a
		// rotation, so equal loads still spread the replicas around.
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int {
			if load[a] != load[b] {
				return load[a] - load[b]
			}
			return (a-int(p%uint32(n))+n)%n - (b-int(p%uint32(n))+n)%n
		})
		for _, i := range order[:replicas] {
			out[p] = append(out[p], sorted[i])
			load[i]++
		}
	}
	return out, nil
}
