package recovery

import (
	"fmt"
	"slices"
)

// The settlement of a lost registration (docs/DESIGN.md "Without the
// coordinator" and "Settling a lapse"): what a node decides, once it is
// registered again, about the replicas it kept running while it was not.
// Pure: the driver (recovery/node's registration.go, the simulator's
// source nodes) reads etcd and its feeds, waits, and fails the replicas;
// Settle only decides, from what the node knows at the moment it asks.
//
// The rules, in order:
//
//  1. The lease outlived the outage (no lapse): no node took this one for
//     dead, every initiator kept waiting for it, so nothing was missed.
//  2. Otherwise every node of the membership read after registering
//     again, and every node that registered meanwhile, is checked: one
//     whose feed into this node is the very connection that was open when
//     the registration was lost sent it every txn (initiators keep a feed
//     to a node etcd takes for dead), and that has no other process alive
//     or registered meanwhile, sent it every txn. None else: nothing was
//     missed.
//  3. Each other node (a gap) is asked what it sequenced without a feed
//     here, by process, as the hellos of its feeds here since the outage
//     began said (Told): a process that registered meanwhile and is not
//     the live one by those, or, with none since, by its feed having
//     opened and ended before the outage (it sent everything while open),
//     or it cannot say (it never opened a feed here); the live process
//     once its feed is open now, which is waited for (Wait) until the
//     driver's bound runs out (Expired). A process whose feed was open
//     when the registration was lost sent everything on it until it ended.
//     One that never opened a feed here says nothing of a partition no
//     other replica of which was live for any view it may have had
//     (SettleProcess.Others): an initiator sequences a txn only with a
//     live replica in its view to answer it, and with a feed to every
//     holder its view has alive, this node's replica included. It cannot
//     say for the others. Before, it could not say for any: after an etcd
//     pause that every node lapsed in, a node restarted meanwhile and cut
//     from its peers registered, was fenced unheard, and the two other
//     holders of three partitions each failed its replica for it, so no
//     replica of them was left (rejoin chaos --net-faults on --seed
//     20261202, 10m, +461.7 s). Its view, from its registration on, had
//     one of them live only once that one had registered again, and
//     then needed a feed there: the first to register again keeps.
//  4. A history that could not be read (Compacted) cannot say either.
//  5. If any gap cannot say, every replica fails; otherwise exactly the
//     replicas of the partitions named fail.
//  6. Except a partition whose replica here is alone: none of its other
//     replicas was live for any initiator at any moment of the outage
//     (SettleInput.Others). An initiator answers a call only on the
//     result of a replica it counts live, so no txn of that partition was
//     acknowledged without this replica. A gap sent a txn of it only
//     while it counted this replica live, so with a feed here open or
//     logging (a call is refused unfed otherwise): what it sent
//     elsewhere and not here comes with that feed's resume or its
//     initiator's tail repair, or fails the replica then (a hello naming
//     it missed, a feed that cannot resume). A gap that
//     cannot say, or is waited for, neither fails nor holds it: failing
//     it would lose the partition's last live copy for what no client
//     was told (rejoin chaos --net-faults on --seed 1129202611, 10m:
//     three partitions lost so after a cluster-wide etcd pause). What a
//     gap names missed still fails it.

// SettleFeed is one feed in from an initiator's process.
type SettleFeed struct {
	Node string
	// Inc is the sending process's incarnation (its hello's Epoch).
	Inc uint64
	// Conn names the connection: the same feed has the same Conn before
	// and after the outage, a feed opened again another.
	Conn uint64
}

// SettleTold is what one process's feed hellos here said it sequenced
// without a feed here (wire.Hello.Missed).
type SettleTold struct {
	// Since: a hello of it came since the outage began, and Missed is
	// what those said. Hellos from before speak of an earlier time (an
	// outage settled before, a previous process of this node): a process
	// whose feed here opened and ended before the outage sent everything
	// while it was open, and its tail is repaired.
	Since  bool
	Missed []uint32
}

// SettleProcess is a registration made while the node was not
// registered: a node's process, by its incarnation.
type SettleProcess struct {
	Node string
	Inc  uint64
	// Others, if not nil, holds per partition the nodes other than this
	// one whose replica of it may have been live for some view of this
	// process: live for the cluster at some revision, at or after the
	// process registered, that a view of the outage may have had, read as
	// SettleInput.Others is. A process that never opened a feed here
	// sequenced a partition's txns only with a live replica in its view:
	// this node's, which needs a feed here first, or one of these (rule
	// 3). Nil: any replica may have been live for it.
	Others map[uint32][]string
}

// mayHaveWritten reports whether m, a process that never opened a feed
// here, may have sequenced txns of p without one: it had another live
// replica of p in some view (Others), or which it had is unknown.
func (m SettleProcess) mayHaveWritten(p uint32) bool {
	return m.Others == nil || len(m.Others[p]) > 0
}

// SettleInput is what a node knows when it settles.
type SettleInput struct {
	// Lapsed: the registration was not resumed on its lease (a new
	// record was written): others may have taken the node for dead.
	Lapsed bool
	// Before are the feeds in when the (earliest unsettled) registration
	// was lost; Now those open now.
	Before, Now []SettleFeed
	// Alive is the membership read after registering again: each node
	// alive with its process's incarnation.
	Alive map[string]uint64
	// Meanwhile are the processes that registered between the last
	// revision the node was registered at and its new record (etcd's
	// history). Compacted: that history could not be read.
	Meanwhile []SettleProcess
	Compacted bool
	// Told holds, per node and process, what the hellos of its feeds here
	// said, feeds ended since included; a process absent from it never
	// opened a feed here.
	Told map[string]map[uint64]SettleTold
	// Expired are the nodes whose live process's feed the driver waited
	// for past its bound.
	Expired map[string]bool
	// Partitions are the partitions with a replica here.
	Partitions []uint32
	// Holders, if not nil, holds per partition the nodes that may have
	// sequenced its txns during the outage: only a node holding a replica
	// of a partition in its own view sequences its txns (docs/DESIGN.md
	// "Sequencers per partition"), so the driver lists every node that
	// held one at any revision such a view may have had (SettleScoped).
	// A gap that is not among a partition's holders decides nothing about
	// it: the partition is settled without waiting for that gap, and does
	// not fail because it cannot say. What a gap names missed counts
	// wherever it points. Nil: any node may have sequenced any partition
	// (the simulator's initiators hold no replica).
	Holders map[uint32][]string
	// Others, if not nil, holds per partition the nodes other than this
	// one whose replica of it may have been live for some initiator at
	// some moment of the outage: the driver lists every node whose
	// replica record said live while its node was registered, at any
	// revision a view of the outage may have had. A partition with none
	// here is alone (rule 6). Nil: any replica may have been live.
	Others map[uint32][]string
}

// SettleVerdict is what a settlement decided.
type SettleVerdict uint8

const (
	// SettleKeep: the replicas missed nothing; they stay live.
	SettleKeep SettleVerdict = iota
	// SettleFail: the replicas of SettleOutcome.Fail missed txns (or may
	// have); the others stay live.
	SettleFail
	// SettleWait: the feed of SettleOutcome.WaitFor's live process is not
	// open yet; ask again once it is, or once the wait for it ran out
	// (SettleInput.Expired). The partitions of SettleOutcome.Pending wait
	// with it; the others are settled already: Fail names those that
	// fail whatever the waited for say (a gap named them missed, or one
	// that holds them cannot say), and, with SettleInput.Holders, those
	// of no waited-for holder are kept.
	SettleWait
)

var settleVerdictNames = [...]string{"keep", "fail", "wait"}

func (v SettleVerdict) String() string { return settleVerdictNames[v] }

// CompactedNode names, among the gaps, the nodes of a history that could
// not be read.
const CompactedNode = "(history compacted)"

// SettleOutcome is a settlement's decision.
type SettleOutcome struct {
	Verdict SettleVerdict
	// WaitFor is the node waited for (SettleWait).
	WaitFor string
	// Fail holds, for SettleFail, why each partition's replica fails.
	Fail map[uint32]string
	// Gaps are the nodes whose feed did not stay open throughout, in
	// order; Unknown those of them that cannot say what they sent; Missed
	// who named each partition.
	Gaps, Unknown []string
	Missed        map[uint32][]string
	// Pending are the partitions not settled yet (SettleWait).
	Pending map[uint32]bool
	// Alone are the partitions kept by rule 6 that a gap which cannot
	// say, or is waited for, would have failed or held.
	Alone []uint32
}

// Settle decides what a node's replicas missed while it was not
// registered (the rules above), each partition by the gaps among its
// holders (SettleInput.Holders; all of them without).
func Settle(in *SettleInput) SettleOutcome {
	if !in.Lapsed {
		return SettleOutcome{Verdict: SettleKeep}
	}
	gaps := settleGaps(in)
	if len(gaps) == 0 {
		return SettleOutcome{Verdict: SettleKeep}
	}
	out := SettleOutcome{Gaps: gaps, Missed: map[uint32][]string{}, Fail: map[uint32]string{}}
	var waiting, unknownAll []string
	muted := map[string][]SettleProcess{} // per gap, its processes never heard here
	for _, node := range gaps {
		ps, known, wait, mute := missedBy(in, node)
		switch {
		case wait:
			waiting = append(waiting, node)
		case !known:
			unknownAll = append(unknownAll, node)
		}
		if len(mute) > 0 {
			muted[node] = mute
		}
		for _, p := range ps {
			if !slices.Contains(out.Missed[p], node) {
				out.Missed[p] = append(out.Missed[p], node)
			}
		}
	}
	// The gaps that cannot say what they sent of each partition: those
	// that cannot say of any (the live process of a gap, or a silent one
	// whose other live replicas are unknown), and those with a silent
	// process that may have written it.
	silentFor := func(p uint32) []string {
		var nodes []string
		for _, node := range gaps {
			if slices.ContainsFunc(muted[node], func(m SettleProcess) bool { return m.mayHaveWritten(p) }) {
				nodes = append(nodes, node)
			}
		}
		return nodes
	}
	out.Unknown = slices.Clone(unknownAll)
	for _, node := range gaps {
		if slices.ContainsFunc(muted[node], func(m SettleProcess) bool { return m.Others == nil }) {
			out.Unknown = append(out.Unknown, node)
		}
	}
	unknownOf := make(map[uint32][]string, len(in.Partitions))
	for _, p := range in.Partitions {
		unknown := in.concern(p, slices.Concat(unknownAll, silentFor(p)))
		slices.Sort(unknown)
		unknownOf[p] = slices.Compact(unknown)
		out.Unknown = append(out.Unknown, unknownOf[p]...)
	}
	slices.Sort(out.Unknown)
	out.Unknown = slices.Compact(out.Unknown)
	// A partition fails as soon as one gap makes it fail; it is kept
	// only once none of its gaps is waited for.
	for _, p := range in.Partitions {
		unknown, alone := unknownOf[p], in.alone(p)
		switch {
		case len(unknown) > 0 && !alone:
			out.Fail[p] = fmt.Sprintf("registration lapsed and the feeds of %v did not stay open throughout; %v cannot say what they sent meanwhile: txns may have been missed", gaps, unknown)
		case len(out.Missed[p]) > 0:
			out.Fail[p] = fmt.Sprintf("registration lapsed, and %v sequenced txns of partition %d without a feed here meanwhile", out.Missed[p], p)
		case alone:
			// Kept whatever the gaps that cannot say, or are waited
			// for, sent: rule 6.
			if len(unknown) > 0 || len(in.concern(p, waiting)) > 0 {
				out.Alone = append(out.Alone, p)
			}
		default:
			if w := in.concern(p, waiting); len(w) > 0 {
				if out.Pending == nil {
					out.Pending = map[uint32]bool{}
					out.WaitFor = w[0]
				}
				out.Pending[p] = true
			}
		}
	}
	switch {
	case out.Pending != nil:
		out.Verdict = SettleWait
	case len(out.Fail) > 0:
		out.Verdict = SettleFail
	}
	return out
}

// concern returns the nodes of gaps that may have sequenced txns of p:
// its holders (SettleInput.Holders), or all of them. A history that could
// not be read concerns every partition.
func (in *SettleInput) concern(p uint32, gaps []string) []string {
	if in.Holders == nil {
		return gaps
	}
	var out []string
	for _, g := range gaps {
		if g == CompactedNode || slices.Contains(in.Holders[p], g) {
			out = append(out, g)
		}
	}
	return out
}

// alone reports whether no replica of p but the one here may have been
// live during the outage (SettleInput.Others).
func (in *SettleInput) alone(p uint32) bool {
	return in.Others != nil && len(in.Others[p]) == 0
}

// settleGaps lists, in order, the nodes to check (alive now or registered
// meanwhile) whose feed here now is not the one open before.
func settleGaps(in *SettleInput) []string {
	nodes := map[string]bool{}
	for node := range in.Alive {
		nodes[node] = true
	}
	for _, m := range in.Meanwhile {
		nodes[m.Node] = true
	}
	if in.Compacted {
		nodes[CompactedNode] = true
	}
	before := map[uint64]bool{}
	for _, f := range in.Before {
		before[f.Conn] = true
	}
	now := map[string]SettleFeed{}
	for _, f := range in.Now {
		now[f.Node] = f
	}
	var gaps []string
	for node := range nodes {
		f, ok := now[node]
		// The feed open throughout vouches for its own process only: a
		// newer one (alive now, or registered meanwhile) may have
		// sequenced txns while that feed was still open here.
		other := slices.ContainsFunc(in.Meanwhile, func(m SettleProcess) bool { return m.Node == node && m.Inc != f.Inc })
		if inc, alive := in.Alive[node]; alive && inc != f.Inc {
			other = true
		}
		if !ok || !before[f.Conn] || other {
			gaps = append(gaps, node)
		}
	}
	slices.Sort(gaps)
	return gaps
}

// missedBy says what node's processes sequenced without a feed here:
// those that registered meanwhile by what they told, the live one by its
// open feed's hello. known is false when the live one cannot say; wait is
// true when its feed is not open yet and its wait not over. mute are the
// processes that registered meanwhile and never opened a feed here: they
// say only of the partitions no other replica of which was live for them
// (SettleProcess.Others).
func missedBy(in *SettleInput, node string) (ps []uint32, known, wait bool, mute []SettleProcess) {
	if node == CompactedNode && in.Compacted {
		return nil, false, false, nil
	}
	inc, alive := in.Alive[node] // the live process's; none if not alive
	for _, m := range in.Meanwhile {
		if m.Node != node || alive && m.Inc == inc {
			continue
		}
		if slices.ContainsFunc(in.Before, func(f SettleFeed) bool { return f.Node == node && f.Inc == m.Inc }) {
			continue // its feed was open here when the registration was lost
		}
		told, ok := in.Told[node][m.Inc]
		if !ok {
			mute = append(mute, m) // it never opened a feed here
			continue
		}
		ps = append(ps, told.Missed...) // none unless told since the outage
	}
	if !alive {
		return ps, true, false, mute
	}
	for _, f := range in.Now {
		if f.Node == node && f.Inc == inc {
			// Every hello of it since the outage: a feed of it that
			// opened and broke meanwhile told what the open one, which
			// names only what came after, does not.
			return append(ps, in.Told[node][inc].Missed...), true, false, mute
		}
	}
	if in.Expired[node] {
		return ps, false, false, mute
	}
	return ps, false, true, mute
}
