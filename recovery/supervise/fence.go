package supervise

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fencing within a bound (docs/DESIGN.md "Fencing by the peers' word"):
// a node that hears nothing from a peer's process for a while reports it
// under its own lease; once a majority of the other registered nodes
// report the same process, any of them fences it in one etcd transaction
// that removes its record and writes its fence. Every node then takes the
// process for dead at once, without waiting for its lease, and the fenced
// process registers again only once it reaches enough of the live nodes
// (the node's registration gate), clearing its fence as it does. Reports
// that no majority backs, a link cut between two nodes, fence the node
// CutDue names (DESIGN "A cut between two nodes").
//
// The keys lie between the node and the replica records, so the
// membership's one watch brings them in revision order with the rest.
const (
	outPrefix    = keyRoot + "out/"
	reportPrefix = outPrefix + "report/"
	fencePrefix  = outPrefix + "fence/"
)

// ReportKey is reporter's report on suspect.
func ReportKey(suspect, reporter string) string { return reportPrefix + suspect + "/" + reporter }

// FenceKey is node's fence.
func FenceKey(node string) string { return fencePrefix + node }

// Report says that Reporter hears nothing from Suspect's process Inc (a
// NodeRecord's Started, in Unix nanoseconds).
type Report struct {
	Suspect  string `json:"-"`
	Reporter string `json:"-"`
	Inc      int64  `json:"inc"`
}

// Fence says that node Node's processes up to Inc are fenced: taken for
// dead by every node, whatever their leases say. Rev is the revision of
// the transaction that wrote it: each fence is one event, which a node
// applies once.
type Fence struct {
	Node string `json:"-"`
	Inc  int64  `json:"inc"`
	// By names the node whose transaction fenced it.
	By  string `json:"by"`
	Rev int64  `json:"-"`
}

func decodeReport(kv *mvccpb.KeyValue) (Report, error) {
	var r Report
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return Report{}, fmt.Errorf("%w: report %q: %w", ErrCorrupt, kv.Key, err)
	}
	suspect, reporter, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), reportPrefix), "/")
	if !ok || !strings.HasPrefix(string(kv.Key), reportPrefix) {
		return Report{}, fmt.Errorf("%w: report key %q", ErrCorrupt, kv.Key)
	}
	if err := checkID("node id", suspect, nodeIDBytesMax); err != nil {
		return Report{}, fmt.Errorf("%w: report key %q: %w", ErrCorrupt, kv.Key, err)
	}
	if err := checkID("node id", reporter, nodeIDBytesMax); err != nil {
		return Report{}, fmt.Errorf("%w: report key %q: %w", ErrCorrupt, kv.Key, err)
	}
	r.Suspect, r.Reporter = suspect, reporter
	return r, nil
}

func decodeFence(kv *mvccpb.KeyValue) (Fence, error) {
	var f Fence
	if err := json.Unmarshal(kv.Value, &f); err != nil {
		return Fence{}, fmt.Errorf("%w: fence %q: %w", ErrCorrupt, kv.Key, err)
	}
	node, ok := strings.CutPrefix(string(kv.Key), fencePrefix)
	if !ok {
		return Fence{}, fmt.Errorf("%w: fence key %q", ErrCorrupt, kv.Key)
	}
	if err := checkID("node id", node, nodeIDBytesMax); err != nil {
		return Fence{}, fmt.Errorf("%w: fence key %q: %w", ErrCorrupt, kv.Key, err)
	}
	f.Node, f.Rev = node, kv.ModRevision
	return f, nil
}

// applyOut applies an event under outPrefix to m; it reports whether
// anything changed.
func (m *Membership) applyOut(ev *clientv3.Event) (bool, error) {
	kv := ev.Kv
	key := string(kv.Key)
	switch {
	case strings.HasPrefix(key, reportPrefix):
		if ev.Type == mvccpb.DELETE {
			_, had := m.Reports[key]
			delete(m.Reports, key)
			return had, nil
		}
		r, err := decodeReport(kv)
		if err != nil {
			return false, err
		}
		changed := m.Reports[key] != r
		m.Reports[key] = r
		return changed, nil
	case strings.HasPrefix(key, fencePrefix):
		node := strings.TrimPrefix(key, fencePrefix)
		if ev.Type == mvccpb.DELETE {
			_, had := m.Fences[node]
			delete(m.Fences, node)
			return had, nil
		}
		f, err := decodeFence(kv)
		if err != nil {
			return false, err
		}
		m.Fences[node] = f
		return true, nil
	}
	return false, nil
}

// listOut reads the reports and fences into m at m.Rev.
func (m *Membership) listOut(ctx context.Context, cli *clientv3.Client) error {
	kvs, _, err := rangeAt(ctx, cli, outPrefix, m.Rev)
	if err != nil {
		return err
	}
	m.Reports, m.Fences = map[string]Report{}, map[string]Fence{}
	for _, kv := range kvs {
		if _, err := m.applyOut(&clientv3.Event{Type: mvccpb.PUT, Kv: kv}); err != nil {
			return err
		}
	}
	return nil
}

// Fenced reports whether process inc of node is fenced in m.
func (m *Membership) Fenced(node string, inc int64) bool {
	f, ok := m.Fences[node]
	return ok && inc <= f.Inc
}

// Due is a process to fence and the registered nodes that report it.
type Due struct {
	Node      string
	Reporters []string
}

// FencesDue lists, in node order, the registered nodes whose process a
// majority of the cluster's other nodes report: the nodes to fence. The
// cluster's nodes are those registered or holding a replica record, so a
// node that died or was fenced still counts in the majority it no longer
// reports in: the nodes fenced one after the other do not shrink it until
// a single report fences (three nodes whose connections all reset at
// once reported each other). A report counts only from a registered
// reporter and on the suspect's registered process. A node cut off from
// all the others, which hears nothing from any, fences no one while they
// fence it.
func FencesDue(m *Membership) []Due {
	by, others := tally(m)
	var due []Due
	for node, reporters := range by {
		if 2*len(reporters) > others {
			slices.Sort(reporters)
			due = append(due, Due{Node: node, Reporters: reporters})
		}
	}
	slices.SortFunc(due, func(a, b Due) int { return strings.Compare(a.Node, b.Node) })
	return due
}

// CutDue is the node to fence when reports stand that no majority backs:
// a link cut between two registered nodes that both reach the rest (a
// bridge's two sides, a single link). Each reports the other, neither is
// reported by a majority, and every partition with a replica on both
// waits for the two for as long as the cut lasts. As VoltDB's mesh
// arbiter does (AgreementSeeker's kill picker: the site most reported,
// ties to the highest id, until the rest is fully connected), it names
// the registered node with the most counted reports, made and received,
// ties to the greatest node id; the fence loop fences it once it stood
// a while, and the next view's reports name the next, until no report
// stands between registered nodes. Reports made count as well as
// received: a node cut off from every peer reports all of them at once,
// as its feeds all go silent together, while the others' reports of it
// come in one by one, and counted by reports received alone, a pick made
// before they were all in fenced one of its peers.
//
// The pick is among the nodes reported. In a one-way cut, where n2
// hears nothing from n1 while n1 hears n2, each has one report, made or
// received; the tie went to the greater id, n2, whom nobody reports, so
// nobody was fenced, and the partitions n1 sequences waited for n2's
// replicas for the whole cut (TestOneWayCutFencesTheSilent). The node
// reported is the one whose word does not come through: its reporter
// fences it.
//
// None while a majority fence is due (FencesDue decides those). And none unless
// the picks, played out, end with a majority of the cluster registered:
// where every connection resets, or a cut comes on top of nodes already
// out, the picks would go on until one node was left, acknowledging
// writes on its replicas alone, and stopped at the majority they fence
// nodes and leave the cut standing among the rest. Five nodes, n2 out and
// {n1,n3} cut from {n4,n5}: n5 was fenced, n4 still cut from n1 and n3,
// and n2, back on n4's side, reached one live node of four and stayed
// out, where with n5 registered its report completed the fences of n1
// and n3 (TestFencedNodeBackMidRepair, failed so under -race). The
// partitions wait for the nodes to come back instead, as a majority
// fence would.
func CutDue(m *Membership) (Due, bool) {
	plan := CutPlan(m)
	if len(plan) == 0 {
		return Due{}, false
	}
	return plan[0], true
}

// CutPlan is CutDue's picks played out: each pick taken out with its
// reports, the next picked from what is left, until no report stands;
// none if a majority's fence is due or the picks would leave no majority
// of the cluster registered. The first is CutDue's.
func CutPlan(m *Membership) []Due {
	by, others := tally(m)
	if len(by) == 0 {
		return nil
	}
	for _, reporters := range by {
		if 2*len(reporters) > others {
			return nil
		}
	}
	var plan []Due
	for pick, ok := cutPick(by); ok; pick, ok = cutPick(by) {
		plan = append(plan, pick)
		delete(by, pick.Node)
		for node, reporters := range by {
			if by[node] = slices.DeleteFunc(reporters, func(r string) bool { return r == pick.Node }); len(by[node]) == 0 {
				delete(by, node)
			}
		}
	}
	if 2*(len(m.Nodes)-len(plan)) <= others+1 {
		return nil
	}
	return plan
}

// cutPick is CutDue's pick among the reports by: of the nodes reported,
// the one with the most reports, made and received, ties to the greatest
// id, with the nodes reporting it; false when there is no report.
func cutPick(by map[string][]string) (Due, bool) {
	degree := map[string]int{}
	for node, reporters := range by {
		degree[node] += len(reporters)
		for _, r := range reporters {
			degree[r]++
		}
	}
	pick := ""
	for node := range by {
		if d := degree[node]; pick == "" || d > degree[pick] || d == degree[pick] && node > pick {
			pick = node
		}
	}
	if pick == "" {
		return Due{}, false
	}
	reporters := slices.Clone(by[pick])
	slices.Sort(reporters)
	return Due{Node: pick, Reporters: reporters}, true
}

// DueOnceReported reports whether node, not registered now, with the
// nodes it reaches (reached) is a majority of the cluster, and each of
// suspects, registered nodes, would be due for a fence (FencesDue) once
// node registered and reported it as well: a fenced process's way back
// when the nodes it cannot reach are the ones its peers report. Five
// nodes, n4 fenced and then a 2|3 split {n1,n2}|{n3,n4,n5}: n4 reached
// n3 and n5, two of the four others, no majority, and stayed out; n3 and
// n5 were two reporters of n1 and n2, where three are needed, and fenced
// no one; nobody served the partitions with a replica on both sides
// until the heal (rejoin chaos --net-faults on --seed 697575384: 13.3 s).
// A majority with the nodes reached, and not node's word alone: of two
// nodes each is a majority of the other's peers, and a node that reaches
// no one would come back only to fence the other. No suspect, or no
// report: false.
func DueOnceReported(m *Membership, node string, reached, suspects []string) bool {
	if len(suspects) == 0 || len(m.Reports) == 0 {
		return false
	}
	by, others := tally(m)
	if 2*(1+len(reached)) <= others+1 {
		return false
	}
	for _, s := range suspects {
		if _, ok := m.Nodes[s]; !ok || s == node || slices.Contains(reached, s) {
			return false
		}
		n := 1
		for _, r := range by[s] {
			if r != node {
				n++
			}
		}
		if 2*n <= others {
			return false
		}
	}
	return true
}

// tally lists, by registered node, the registered nodes that report its
// registered process, and counts the cluster's nodes but one: the
// nodes registered or holding a replica record. No report: no walk of
// the replica records (12,288 at 4096 partitions x 3), which every
// rebuild of a node's view would pay.
func tally(m *Membership) (by map[string][]string, others int) {
	if len(m.Reports) == 0 {
		return nil, 0
	}
	cluster := map[string]bool{}
	for id := range m.Nodes {
		cluster[id] = true
	}
	for _, r := range m.Replicas {
		cluster[r.Node] = true
	}
	by = map[string][]string{}
	for _, r := range m.Reports {
		s, ok := m.Nodes[r.Suspect]
		if _, in := m.Nodes[r.Reporter]; !ok || !in || r.Reporter == r.Suspect || s.Started.UnixNano() != r.Inc {
			continue
		}
		by[r.Suspect] = append(by[r.Suspect], r.Reporter)
	}
	return by, len(cluster) - 1
}

// PutReport writes reporter's report on suspect's process inc under
// lease, the reporter's registration: a reporter that dies takes its
// reports with it.
func PutReport(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID, reporter, suspect string, inc int64) error {
	val, err := encode(Report{Inc: inc})
	if err != nil {
		return err
	}
	if _, err := cli.Put(ctx, ReportKey(suspect, reporter), val, clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("supervise: report %s: %w", suspect, err)
	}
	return nil
}

// DeleteReport withdraws reporter's report on suspect.
func DeleteReport(ctx context.Context, cli *clientv3.Client, reporter, suspect string) error {
	if _, err := cli.Delete(ctx, ReportKey(suspect, reporter)); err != nil {
		return fmt.Errorf("supervise: withdraw report on %s: %w", suspect, err)
	}
	return nil
}

// FenceNode fences suspect's registered process, as by, in one
// transaction, only if every record it stands on is still the one read:
// suspect's (the process the reports named, on its registration), and
// each of reporters', the majority that reported it, by's among them. A
// reporter fenced meanwhile no longer counts, so of nodes that lost each
// other the first fence passes and the ones it undoes do not. It removes
// the record and writes the fence. False: a record changed first;
// nothing was written.
func FenceNode(ctx context.Context, cli *clientv3.Client, by string, suspect NodeRecord, reporters []NodeRecord) (bool, error) {
	if err := checkID("node id", suspect.ID, nodeIDBytesMax); err != nil || suspect.Created <= 0 {
		return false, fmt.Errorf("supervise: fence %q: not a registered record (created %d): %v", suspect.ID, suspect.Created, err)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(NodeKey(suspect.ID)), "=", suspect.Created)}
	self := false
	for _, r := range reporters {
		if r.Created <= 0 || r.ID == suspect.ID {
			return false, fmt.Errorf("supervise: fence %s: reporter %q is not a registered record of another node", suspect.ID, r.ID)
		}
		self = self || r.ID == by
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(NodeKey(r.ID)), "=", r.Created))
	}
	if !self {
		return false, fmt.Errorf("supervise: fence %s: the fencer %s is not among its reporters", suspect.ID, by)
	}
	val, err := encode(Fence{Inc: suspect.Started.UnixNano(), By: by})
	if err != nil {
		return false, err
	}
	resp, err := cli.Txn(ctx).If(cmps...).Then(
		clientv3.OpDelete(NodeKey(suspect.ID)),
		clientv3.OpPut(FenceKey(suspect.ID), val),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("supervise: fence %s: %w", suspect.ID, err)
	}
	return resp.Succeeded, nil
}

// ReadFence reads node's fence, if any.
func ReadFence(ctx context.Context, cli *clientv3.Client, node string) (Fence, bool, error) {
	resp, err := cli.Get(ctx, FenceKey(node))
	if err != nil {
		return Fence{}, false, fmt.Errorf("supervise: read fence of %s: %w", node, err)
	}
	if len(resp.Kvs) == 0 {
		return Fence{}, false, nil
	}
	f, err := decodeFence(resp.Kvs[0])
	return f, err == nil, err
}

// ClearFence removes f, if it is still the fence there: the fenced
// process does, once it may register again.
func ClearFence(ctx context.Context, cli *clientv3.Client, f Fence) error {
	_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(FenceKey(f.Node)), "=", f.Rev)).
		Then(clientv3.OpDelete(FenceKey(f.Node))).Commit()
	if err != nil {
		return fmt.Errorf("supervise: clear the fence of %s: %w", f.Node, err)
	}
	return nil
}
