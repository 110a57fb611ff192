package supervise

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// Key layout in etcd (see doc.go). The claims and tasks prefixes belong to
// recovery/claim; this package reads the claims prefix directly because
// claim exports no listing of claim keys.
const (
	keyRoot          = "/rejoin/"
	nodesPrefix      = keyRoot + "nodes/"
	replicasPrefix   = keyRoot + "replicas/"
	assignPrefix     = keyRoot + "assign/"
	claimsPrefix     = keyRoot + "claims/"
	electionPrefix   = keyRoot + "supervisor"
	partitionDigits  = 10
	nodeIDBytesMax   = claim.NodeBytesMax
	addressBytesMax  = 256
	snapshotKeysMax  = claim.TasksMax // per prefix, as claim bounds its listings
	snapshotPageKeys = 512
)

// ReplicasPrefix prefixes every ReplicaKey and IncarnationsPrefix every
// IncarnationKey: layout.Init clears the first before it writes a
// placement and refuses an etcd whose second holds another cluster's
// nodes.
const (
	ReplicasPrefix     = replicasPrefix
	IncarnationsPrefix = incarnationsPrefix
)

func partitionSegment(p uint32) string { return fmt.Sprintf("%0*d", partitionDigits, p) }

func taskSuffix(t claim.Task) string { return partitionSegment(t.Partition) + "/" + t.Dest }

// NodeKey is the etcd key of a node's registration.
func NodeKey(id string) string { return nodesPrefix + id }

// ReplicaKey is the etcd key of node's replica of partition p.
func ReplicaKey(p uint32, node string) string {
	return replicasPrefix + partitionSegment(p) + "/" + node
}

// AssignmentKey is the etcd key of a task's assignment.
func AssignmentKey(t claim.Task) string { return assignPrefix + taskSuffix(t) }

// parsePair splits "<partition, 10 digits>/<name>".
func parsePair(suffix string) (uint32, string, error) {
	p, name, ok := strings.Cut(suffix, "/")
	if !ok || len(p) != partitionDigits || name == "" || strings.Contains(name, "/") {
		return 0, "", fmt.Errorf("supervise: malformed key suffix %q", suffix)
	}
	n, err := strconv.ParseUint(p, 10, 32)
	if err != nil {
		return 0, "", fmt.Errorf("supervise: malformed key suffix %q: %w", suffix, err)
	}
	return uint32(n), name, nil
}

// checkID rejects a node id that cannot be a key segment.
func checkID(what, s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrBadName, what)
	case len(s) > max:
		return fmt.Errorf("%w: %s of %d bytes, at most %d", ErrBadName, what, len(s), max)
	case strings.ContainsAny(s, "/"):
		return fmt.Errorf("%w: %s %q contains '/'", ErrBadName, what, s)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: %s %q has a control character", ErrBadName, what, s)
		}
	}
	return nil
}
