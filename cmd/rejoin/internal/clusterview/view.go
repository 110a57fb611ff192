package clusterview

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// StatusTimeoutDefault bounds one node's GET /status.
const StatusTimeoutDefault = time.Second

// statusBytesMax bounds the body of one /status answer.
const statusBytesMax = 16 << 20

// View is one reading of the cluster. Nodes, Replicas and Tasks come from
// etcd (one snapshot); Status from the nodes, read right after.
type View struct {
	Read  time.Time `json:"read"`
	Nodes []NodeRow `json:"nodes"`
	// Down are the nodes the placement gives replicas that are not
	// registered: dead, stopped, or cut off from etcd.
	Down     []DownRow    `json:"down,omitempty"`
	Replicas []ReplicaRow `json:"replicas"`
	Tasks    []TaskRow    `json:"tasks"`
	// Moves are the membership moves under way (rejoin drain, rebalance).
	Moves []MoveRow `json:"moves,omitempty"`
	// Losses are the losses an admin accepted (rejoin accept-loss): each
	// partition named lacks what its held replica had missed.
	Losses []supervise.Loss `json:"losses,omitempty"`
	// Status holds each live node's answer, by node id; a node that did
	// not answer has its error in NodeRow.StatusErr instead.
	Status map[string]node.Status `json:"status,omitempty"`
}

// NodeRow is a registered node.
type NodeRow struct {
	ID         string    `json:"id"`
	Addr       string    `json:"addr"`
	HTTP       string    `json:"http"`
	Status     string    `json:"status"`
	Started    time.Time `json:"started"`
	LastActive time.Time `json:"last_active"`
	// StatusErr: why its /status could not be read, if so.
	StatusErr string `json:"status_err,omitempty"`
}

// DownRow is a node of the placement that is not registered.
type DownRow struct {
	ID string `json:"id"`
	// Replicas counts the replicas the placement gives it.
	Replicas int `json:"replicas"`
}

// ReplicaRow is one replica of one partition: its placement state in etcd
// and, if its node is alive and answered, what the node says of it.
type ReplicaRow struct {
	Partition uint32 `json:"partition"`
	Node      string `json:"node"`
	// Placement is the state in etcd (live, needs-rejoin).
	Placement recovery.ReplicaState `json:"placement"`
	// Alive: the node is registered.
	Alive bool `json:"alive"`
	// Reported: the node answered /status and hosts the replica; then
	// State, Rows, Digest and LastExecuted are its own.
	Reported bool                  `json:"reported"`
	State    recovery.ReplicaState `json:"state,omitempty"`
	// Settling: the node is settling a lost registration; the replica may
	// still fail (node.ReplicaStatus.Settling).
	Settling bool `json:"settling,omitempty"`
	// Held says why the replica is held, as its record in etcd has it
	// (supervise.Replica.Held): it keeps its rows and answers nothing
	// until a live replica comes back or rejoin accept-loss.
	Held         string `json:"held,omitempty"`
	Rows         int64  `json:"rows"`
	Digest       uint64 `json:"digest"`
	LastExecuted uint64 `json:"last_executed"`
}

// MoveRow is one membership move under way: the partition's replica on
// To rebuilds (its rejoin task shows the progress); once live, From's goes.
type MoveRow struct {
	Partition uint32    `json:"partition"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Started   time.Time `json:"started"`
	// ToState is the new replica's placement state (needs-rejoin, live).
	ToState string `json:"to_state"`
}

// TaskRow is one rejoin task with its assignment and progress.
type TaskRow struct {
	Partition uint32 `json:"partition"`
	Dest      string `json:"dest"`
	Source    string `json:"source,omitempty"`
	Status    string `json:"status"`
	Epoch     uint64 `json:"epoch,omitempty"`
	Attempts  uint32 `json:"attempts"`
	Note      string `json:"note,omitempty"`
	// Progress, from the destination's (else the source's) RejoinStatus.
	Phase string `json:"phase,omitempty"`
	Rows  int64  `json:"rows"`
	Bytes int64  `json:"bytes"`
	Held  bool   `json:"held,omitempty"`
	Err   string `json:"err,omitempty"`
	// SourceRows is the source replica's row count: Rows / SourceRows is
	// the progress. 0 when unknown.
	SourceRows int64 `json:"source_rows"`
}

// Progress is Rows/SourceRows in percent, capped at 100; 100 once the
// replica is live (the source kept taking writes, so its row count moved
// on from what was shipped); -1 when unknown.
func (t TaskRow) Progress() float64 {
	if t.Phase == "live" {
		return 100
	}
	if t.SourceRows <= 0 {
		return -1
	}
	return min(100, 100*float64(t.Rows)/float64(t.SourceRows))
}

// Read reads the cluster once. Nodes that do not answer /status within
// timeout (StatusTimeoutDefault if 0) are reported, not fatal.
func Read(ctx context.Context, cli *clientv3.Client, hc *http.Client, timeout time.Duration) (View, error) {
	snap, err := supervise.ReadSnapshot(ctx, cli)
	if err != nil {
		return View{}, err
	}
	if timeout <= 0 {
		timeout = StatusTimeoutDefault
	}
	nodes := make([]supervise.NodeRecord, 0, len(snap.Nodes))
	for _, n := range snap.Nodes {
		nodes = append(nodes, n)
	}
	moves, err := supervise.ListMoves(ctx, cli)
	if err != nil {
		return View{}, err
	}
	losses, err := supervise.Losses(ctx, cli)
	if err != nil {
		return View{}, err
	}
	statuses, errs := FetchAll(ctx, hc, nodes, timeout)
	v := Build(snap, statuses, errs, time.Now())
	v.Losses = losses
	for _, m := range moves {
		row := MoveRow{Partition: m.Partition, From: m.From, To: m.To, Started: m.Started, ToState: "?"}
		for _, r := range v.Replicas {
			if r.Partition == m.Partition && r.Node == m.To {
				row.ToState = r.Placement.String()
			}
		}
		v.Moves = append(v.Moves, row)
	}
	return v, nil
}

// FetchAll reads GET /status of every node at once, each within timeout.
func FetchAll(ctx context.Context, hc *http.Client, nodes []supervise.NodeRecord, timeout time.Duration) (map[string]node.Status, map[string]error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	out, errs := map[string]node.Status{}, map[string]error{}
	for _, n := range nodes {
		wg.Go(func() {
			var st node.Status
			var err error
			if n.HTTP == "" {
				err = fmt.Errorf("no admin HTTP address registered")
			} else {
				st, err = FetchStatus(ctx, hc, n.HTTP, timeout)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[n.ID] = err
			} else {
				out[n.ID] = st
			}
		})
	}
	wg.Wait()
	return out, errs
}

// FetchStatus reads GET http://<addr>/status within timeout; addr may
// name its scheme (a node off loopback registers https://host:port, and
// hc then needs a certificate of the cluster's CA).
func FetchStatus(ctx context.Context, hc *http.Client, addr string, timeout time.Duration) (node.Status, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := "http://" + addr + "/status"
	if strings.Contains(addr, "://") {
		url = addr + "/status"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return node.Status{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return node.Status{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return node.Status{}, fmt.Errorf("GET /status of %s: %s", addr, resp.Status)
	}
	var st node.Status
	if err := json.NewDecoder(io.LimitReader(resp.Body, statusBytesMax)).Decode(&st); err != nil {
		return node.Status{}, fmt.Errorf("GET /status of %s: %w", addr, err)
	}
	return st, nil
}

// Build assembles a View from a snapshot and the nodes' answers; pure, so
// tests feed it canned data.
func Build(snap supervise.Snapshot, statuses map[string]node.Status, errs map[string]error, now time.Time) View {
	v := View{Read: now, Status: statuses}
	for _, n := range snap.Nodes {
		row := NodeRow{ID: n.ID, Addr: n.Address, HTTP: n.HTTP, Status: string(n.Status), Started: n.Started, LastActive: n.LastActive}
		if err := errs[n.ID]; err != nil {
			row.StatusErr = err.Error()
		}
		v.Nodes = append(v.Nodes, row)
	}
	slices.SortFunc(v.Nodes, func(a, b NodeRow) int { return cmpNodeID(a.ID, b.ID) })

	for p, reps := range snap.Replicas {
		for _, r := range reps {
			row := ReplicaRow{Partition: p, Node: r.Node, Placement: r.State, Held: r.Held}
			_, row.Alive = snap.Nodes[r.Node]
			if rs, ok := replicaOf(statuses, r.Node, p); ok && row.Alive {
				row.Reported = true
				row.State, row.Rows, row.Digest, row.LastExecuted = rs.State, rs.Rows, rs.Digest, rs.LastExecuted
				row.Settling = rs.Settling
			}
			v.Replicas = append(v.Replicas, row)
		}
	}
	slices.SortFunc(v.Replicas, func(a, b ReplicaRow) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmpNodeID(a.Node, b.Node))
	})
	down := map[string]int{}
	for _, r := range v.Replicas {
		if !r.Alive {
			down[r.Node]++
		}
	}
	for id, n := range down {
		v.Down = append(v.Down, DownRow{ID: id, Replicas: n})
	}
	slices.SortFunc(v.Down, func(a, b DownRow) int { return cmpNodeID(a.ID, b.ID) })

	for _, t := range snap.Tasks {
		row := TaskRow{Partition: t.Task.Partition, Dest: t.Task.Dest, Status: t.Status.String(),
			Epoch: t.Epoch, Attempts: t.Attempts, Note: t.Note}
		if a, ok := snap.Assignments[t.Task]; ok {
			row.Source = a.Source
		}
		if rj := rejoinOf(statuses, row.Partition, row.Dest, row.Source); rj != nil {
			row.Phase, row.Rows, row.Bytes, row.Held, row.Err = rj.Phase, rj.Rows, rj.Bytes, rj.Held, rj.Err
			if row.Source == "" {
				row.Source = rj.Peer
			}
			if rj.Role == "destination" {
				row.Held = row.Held || sourceHeld(statuses, row.Partition, row.Dest, row.Source)
			}
		}
		if rs, ok := replicaOf(statuses, row.Source, row.Partition); ok {
			row.SourceRows = rs.Rows
		}
		v.Tasks = append(v.Tasks, row)
	}
	slices.SortFunc(v.Tasks, func(a, b TaskRow) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmpNodeID(a.Dest, b.Dest))
	})
	return v
}

// replicaOf finds what node says of its replica of partition p.
func replicaOf(statuses map[string]node.Status, nodeID string, p uint32) (node.ReplicaStatus, bool) {
	st, ok := statuses[nodeID]
	if !ok {
		return node.ReplicaStatus{}, false
	}
	for _, r := range st.Replicas {
		if r.Partition == p {
			return r, true
		}
	}
	return node.ReplicaStatus{}, false
}

// rejoinOf finds the rejoin of partition p into dest: the destination's
// own view if it answered, else the source's.
func rejoinOf(statuses map[string]node.Status, p uint32, dest, source string) *node.RejoinStatus {
	if r, ok := replicaOf(statuses, dest, p); ok && r.Rejoin != nil {
		return r.Rejoin
	}
	if source == "" {
		return nil
	}
	if r, ok := replicaOf(statuses, source, p); ok {
		for i := range r.Sources {
			if r.Sources[i].Peer == dest {
				return &r.Sources[i]
			}
		}
	}
	return nil
}

// sourceHeld reports whether source says its stream of p to dest is held.
func sourceHeld(statuses map[string]node.Status, p uint32, dest, source string) bool {
	r, ok := replicaOf(statuses, source, p)
	if !ok {
		return false
	}
	for _, s := range r.Sources {
		if s.Peer == dest && s.Held && s.Ended.IsZero() {
			return true
		}
	}
	return false
}

// cmpNodeID orders "n2" before "n10".
func cmpNodeID(a, b string) int {
	var x, y int
	if _, err := fmt.Sscanf(a, "n%d", &x); err == nil {
		if _, err := fmt.Sscanf(b, "n%d", &y); err == nil && x != y {
			return cmp.Compare(x, y)
		}
	}
	return cmp.Compare(a, b)
}

// CmpNodeID orders node ids numerically ("n2" before "n10").
func CmpNodeID(a, b string) int { return cmpNodeID(a, b) }
