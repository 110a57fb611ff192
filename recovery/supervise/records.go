package supervise

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

// Errors of the package, classified with errors.Is.
var (
	// ErrBadName: a node id or address that cannot be stored.
	ErrBadName = errors.New("supervise: bad name")
	// ErrConfig: a TTL, window or interval out of range.
	ErrConfig = errors.New("supervise: bad config")
	// ErrNodeLost: the node's registration ended (lease gone, record
	// removed, or etcd unreachable for a window); its work must stop.
	ErrNodeLost = errors.New("supervise: node lost its registration")
	// ErrUnreachable: no activity update reached etcd for a window.
	ErrUnreachable = errors.New("supervise: etcd unreachable for a window")
	// ErrNotAssigned: a decline named an assignment that is no longer the
	// node's (reassigned meanwhile, or the task closed).
	ErrNotAssigned = errors.New("supervise: task not assigned to this node")
	// ErrNotLeader: the supervisor lost its election while writing.
	ErrNotLeader = errors.New("supervise: not the supervisor")
	// ErrCorrupt: a stored value does not decode.
	ErrCorrupt = errors.New("supervise: corrupt record")
)

// NodeStatus is what the health task says of a registered node.
type NodeStatus string

const (
	// NodeReady: the node updates its last activity on time.
	NodeReady NodeStatus = "ready"
	// NodeNotResponding: the node's lease is alive but its last activity
	// is older than the health task's threshold (DESIGN.md step 10: a node may keep
	// its lease while stuck). It gets no new assignment until it updates
	// its activity again, which sets it back to ready.
	NodeNotResponding NodeStatus = "not-responding"
)

// NodeRecord is a node's registration, as JSON under NodeKey, attached to
// the node's lease: the key exists exactly while the lease is alive, so a
// node without a record is dead.
type NodeRecord struct {
	ID      string `json:"-"`
	Address string `json:"address"`
	// HTTP is the node's admin HTTP address (status, metrics), if any.
	HTTP string `json:"http,omitempty"`
	// Started is when this incarnation registered.
	Started time.Time `json:"started"`
	// LastActive is the node's latest activity update, by its own clock.
	LastActive time.Time  `json:"last_active"`
	Status     NodeStatus `json:"status"`
	// OutgoingMax is how many rejoins the node serves as a source at once;
	// the supervisor assigns it no more. 0 means OutgoingMaxDefault.
	OutgoingMax int `json:"outgoing_max,omitempty"`
	// ViewRev is the etcd revision of the membership view the node's
	// initiator sequences calls with, as of the record's last write: a
	// replica that a move added at a revision at or below every running
	// node's ViewRev gets every txn of its partition from then on
	// (docs/DESIGN.md "Membership moves").
	ViewRev int64 `json:"view_rev,omitempty"`

	// Created is the key's CreateRevision: one incarnation's registration.
	// ModRevision is for the compare-and-swap of the next write.
	Created     int64 `json:"-"`
	ModRevision int64 `json:"-"`
	// Lease is the node's lease, as etcd keeps it with the key.
	Lease int64 `json:"-"`
}

// OutgoingMaxDefault is a source's limit of concurrent outgoing rejoins
// when its record names none: each one costs a change log and a stream.
const OutgoingMaxDefault = 2

func (n NodeRecord) outgoingMax() int {
	if n.OutgoingMax <= 0 {
		return OutgoingMaxDefault
	}
	return n.OutgoingMax
}

// Replica says that Node hosts a replica of Partition, in State. Stored as
// JSON {"state": ...} under ReplicaKey, without a lease: placement outlives
// the node's process.
type Replica struct {
	Partition uint32 `json:"-"`
	Node      string `json:"-"`
	// State is recovery.ReplicaLive or recovery.ReplicaNeedsRejoin: a
	// replica being rebuilt is needs-rejoin here, since it may be no
	// one's source until it is live. Stored by name ("live").
	State recovery.ReplicaState `json:"state"`
	// Held says why the replica is held (recovery.ReplicaHeld: it may
	// lack txns of its partition and no other replica was live to rebuild
	// it from), with State needs-rejoin: no one takes it for a source or
	// sends it txns, and it keeps its rows until a live replica comes
	// back or an admin accepts the loss. Empty unless held.
	Held string `json:"held,omitempty"`
	// LossAccepted, on a held replica's record, is when an admin accepted
	// the loss (AcceptLoss): the node makes the replica live again at its
	// last txn and writes the record anew without either field.
	LossAccepted time.Time `json:"loss_accepted,omitzero"`
	// Created is the etcd revision that created the record (read, never
	// written): when the placement gave Node the partition. A view from
	// before it sends the partition's txns to the other holders alone.
	Created int64 `json:"-"`
	// ModRevision is the etcd revision of the record's last write (read,
	// never written): it changes with every state the node publishes,
	// so a replica that failed and was rebuilt between two reads, never
	// seen needing a rejoin, still reads as changed.
	ModRevision int64 `json:"-"`
}

// Assignment is the supervisor's choice of a source for one task, as JSON
// under AssignmentKey. The assigned source's executor claims the task
// (claim.Acquire) and works it; the claim's epoch is the attempt's fencing
// epoch.
//
// Invariants: Seq grows by one at each assignment of the task's generation
// Opened; Source is a node that hosted a live replica of the partition and
// was alive when assigned, never the destination; Declined lists the
// sources that refused this generation of the task, and the supervisor
// does not assign it to them again.
type Assignment struct {
	Task   claim.Task `json:"-"`
	Source string     `json:"source"`
	Seq    uint32     `json:"seq"`
	// Opened is the task generation (claim.Record.Opened) assigned: an
	// assignment of an older generation is void.
	Opened     uint64    `json:"opened"`
	AssignedAt time.Time `json:"assigned_at"`
	// Superseded is the claim epoch of the attempt this one replaced, 0 if
	// none: the new attempt's claim has a higher epoch.
	Superseded uint64   `json:"superseded,omitempty"`
	Declined   []string `json:"declined,omitempty"`
	Reason     string   `json:"reason"`

	ModRevision int64 `json:"-"`
}

// declinedBy reports whether node refused the assignment's task.
func (a Assignment) declinedBy(node string) bool { return slices.Contains(a.Declined, node) }

func encode(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("supervise: encode: %w", err)
	}
	return string(b), nil
}

// The decoders refuse what no writer stores, as ErrCorrupt: a key that
// is not a record's, a name that is not a node id, a status or state
// outside its enum (a JSON null decodes to none). Times are read back in
// UTC, as written, so that any record read can be written again.

func decodeNode(kv *mvccpb.KeyValue) (NodeRecord, error) {
	var n NodeRecord
	if err := json.Unmarshal(kv.Value, &n); err != nil {
		return NodeRecord{}, fmt.Errorf("%w: node %q: %w", ErrCorrupt, kv.Key, err)
	}
	id, ok := bytes.CutPrefix(kv.Key, []byte(nodesPrefix))
	if !ok {
		return NodeRecord{}, fmt.Errorf("%w: node key %q", ErrCorrupt, kv.Key)
	}
	if err := checkID("node id", string(id), nodeIDBytesMax); err != nil {
		return NodeRecord{}, fmt.Errorf("%w: node key %q: %w", ErrCorrupt, kv.Key, err)
	}
	if n.Status != NodeReady && n.Status != NodeNotResponding {
		return NodeRecord{}, fmt.Errorf("%w: node %q: status %q", ErrCorrupt, kv.Key, n.Status)
	}
	n.ID = string(id)
	n.Started, n.LastActive = normalize(n.Started), normalize(n.LastActive)
	n.Created, n.ModRevision, n.Lease = kv.CreateRevision, kv.ModRevision, kv.Lease
	return n, nil
}

func decodeReplica(kv *mvccpb.KeyValue) (Replica, error) {
	var r Replica
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return Replica{}, fmt.Errorf("%w: replica %q: %w", ErrCorrupt, kv.Key, err)
	}
	p, node, err := parseRecordKey(kv.Key, replicasPrefix)
	if err != nil {
		return Replica{}, err
	}
	if err := r.check(); err != nil {
		return Replica{}, fmt.Errorf("%w: replica %q: %w", ErrCorrupt, kv.Key, err)
	}
	r.LossAccepted = normalize(r.LossAccepted)
	r.Partition, r.Node, r.Created, r.ModRevision = p, node, kv.CreateRevision, kv.ModRevision
	return r, nil
}

// check refuses a record no writer stores: a state other than live or
// needs-rejoin, a hold on a live replica, a loss accepted for a replica
// not held.
func (r Replica) check() error {
	switch {
	case r.State != recovery.ReplicaLive && r.State != recovery.ReplicaNeedsRejoin:
		return fmt.Errorf("state %q", r.State)
	case r.Held != "" && r.State != recovery.ReplicaNeedsRejoin:
		return fmt.Errorf("held, and %s", r.State)
	case !r.LossAccepted.IsZero() && r.Held == "":
		return errors.New("a loss accepted, and not held")
	}
	return nil
}

func decodeAssignment(kv *mvccpb.KeyValue) (Assignment, error) {
	var a Assignment
	if err := json.Unmarshal(kv.Value, &a); err != nil {
		return Assignment{}, fmt.Errorf("%w: assignment %q: %w", ErrCorrupt, kv.Key, err)
	}
	p, dest, err := parseRecordKey(kv.Key, assignPrefix)
	if err != nil {
		return Assignment{}, err
	}
	if err := checkID("source", a.Source, nodeIDBytesMax); err != nil {
		return Assignment{}, fmt.Errorf("%w: assignment %q: %w", ErrCorrupt, kv.Key, err)
	}
	a.Task = claim.Task{Partition: p, Dest: dest}
	a.AssignedAt = normalize(a.AssignedAt)
	a.ModRevision = kv.ModRevision
	return a, nil
}

// parseRecordKey splits the key of a per-partition record under prefix
// into its partition and node id.
func parseRecordKey(key []byte, prefix string) (uint32, string, error) {
	suffix, ok := bytes.CutPrefix(key, []byte(prefix))
	if !ok {
		return 0, "", fmt.Errorf("%w: key %q not under %s", ErrCorrupt, key, prefix)
	}
	p, node, err := parsePair(string(suffix))
	if err == nil {
		err = checkID("node id", node, nodeIDBytesMax)
	}
	if err != nil {
		return 0, "", fmt.Errorf("%w: key %q: %w", ErrCorrupt, key, err)
	}
	return p, node, nil
}

// normalize drops the monotonic reading and the zone, so a time written
// equals the time read back.
func normalize(t time.Time) time.Time { return t.Round(0).UTC() }
