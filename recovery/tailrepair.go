package recovery

import (
	"fmt"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
)

// TailRepair is the rule of a dead initiator's tail repair on one replica
// (recovery/node's repair.go does the asking). An initiator sends each
// txn to every replica of the partition, one feed per node, and feeds are
// TCP streams in ID order, so when its feed ends each survivor holds a
// prefix of its sequence, and nothing past it has run while the initiator
// is in the replica's safe-point tracker. Before a replica stops waiting
// for the initiator it asks every peer replica of the partition (Next)
// for the txns past its own prefix; every survivor then holds the longest
// prefix any survivor got. A peer that died holds nothing that will run
// and does not count. A peer alive that cannot be reached (killed but
// still in the membership, cut off, restarting) may hold a longer prefix:
// it is asked again for as long as it lives, however long that is, and
// the replica holds meanwhile; a network fault alone never fails a
// replica here (docs/DESIGN.md "Feeds that resume"). Only a peer that
// answers that it holds txns past the replica's prefix it no longer
// keeps fails the replica, which then rejoins rather than diverge. The
// repair runs only once the initiator's process is gone from the
// membership; once a request went out it runs to its end, since the
// peer that answered takes the process for dead too. If the process was
// only cut off and comes back, what the survivors agreed on stands and it
// learns it was fenced (wire.Fenced).
type TailRepair struct {
	in     txnid.Initiator
	peers  []string
	next   int
	failed []string
}

// NewTailRepair returns the repair, on node self, of initiator in's tail,
// whose node is initiatorNode; replicaNodes are the nodes of the
// partition's replicas.
func NewTailRepair(in txnid.Initiator, replicaNodes []string, self, initiatorNode string) *TailRepair {
	t := &TailRepair{in: in}
	for _, n := range replicaNodes {
		if n != self && n != initiatorNode {
			t.peers = append(t.peers, n)
		}
	}
	return t
}

// Next returns the next peer to ask, in placement order; false when
// every peer was asked.
func (t *TailRepair) Next() (string, bool) {
	if t.next >= len(t.peers) {
		return "", false
	}
	t.next++
	return t.peers[t.next-1], true
}

// RepairTry is the outcome of one try to repair from a peer.
type RepairTry struct {
	// Err is nil if the peer answered in full.
	Err error
	// Gone: the peer answered that it holds txns past the replica's
	// prefix that it no longer keeps; no retry brings them.
	Gone bool
	// PeerAlive: the membership still has the peer alive. A dead peer
	// holds nothing that will run.
	PeerAlive bool
	// Ended: the repair was cut short (the node stops); the try neither
	// repeats nor counts.
	Ended bool
}

// OnAnswer takes one try's outcome from peer and reports whether to ask
// the same peer again: a peer that cannot be reached may hold a longer
// prefix, so it is asked until it answers or dies. Failing the replica
// instead, after a bound, failed every replica of a partition whose peers
// were cut off from each other for longer than the bound.
func (t *TailRepair) OnAnswer(peer string, try RepairTry) (retry bool) {
	switch {
	case try.Err == nil, try.Ended:
		return false
	case try.Gone:
		t.failed = append(t.failed, fmt.Sprintf("%s: %v", peer, try.Err))
		return false
	}
	return try.PeerAlive
}

// Verdict says, once no peer is left to ask, whether the replica fails
// and why.
func (t *TailRepair) Verdict() (why string, fail bool) {
	if len(t.failed) > 0 {
		return fmt.Sprintf("initiator %d's tail not repaired: %v", t.in, t.failed), true
	}
	return "", false
}

// TailKeptMax is how many of an initiator's latest txns a replica keeps
// for its peers' repairs (Tails). An initiator answers a client only once
// every live replica executed the txn, so what one replica got and
// another did not is at most the initiator's calls in flight when it
// died: far fewer.
const TailKeptMax = 1 << 14

// Tails is what a replica keeps of each initiator's txns for the repair
// of a dead initiator's tail: the highest ID taken in from it (its
// prefix), and its latest txns, each with the incarnation of the process
// that sent it, which a peer asks for past its own prefix (After).
// recovery/node's replicas and the simulator's keep one each.
type Tails struct {
	last   map[txnid.Initiator]txnid.ID
	recent map[txnid.Initiator]*txnRing
}

// Took records a txn or heartbeat id taken in from its initiator, and the
// txn itself (inv not nil) with the incarnation inc of its process.
func (t *Tails) Took(id txnid.ID, inv *partition.Invocation, inc uint64) {
	if t.last == nil {
		t.last, t.recent = map[txnid.Initiator]txnid.ID{}, map[txnid.Initiator]*txnRing{}
	}
	in := id.Initiator()
	if id > t.last[in] {
		t.last[in] = id
	}
	if inv == nil {
		return
	}
	g := t.recent[in]
	if g == nil {
		g = &txnRing{}
		t.recent[in] = g
	}
	g.push(*inv, inc)
}

// Last is the highest ID taken in from in: the replica holds its prefix
// of in's sequence up to there.
func (t *Tails) Last(in txnid.Initiator) txnid.ID { return t.last[in] }

// After returns, in order, the kept txns of in past after sent by
// incarnation inc or an older one: what a peer whose prefix ends at after
// lacks. An error says some of them are no longer kept; no retry brings
// them (RepairTry.Gone).
func (t *Tails) After(in txnid.Initiator, after txnid.ID, inc uint64) ([]partition.Invocation, error) {
	g := t.recent[in]
	switch {
	case g == nil:
		return nil, nil
	case after < g.droppedTo:
		return nil, fmt.Errorf("txns after %v are no longer all kept (kept from %v)", after, g.droppedTo)
	}
	return g.after(after, inc), nil
}

// txnRing keeps an initiator's latest txns, each with the incarnation of
// the process that sent it.
type txnRing struct {
	txns []partition.Invocation
	incs []uint64
	head int // index of the oldest when full
	// droppedTo is the highest ID dropped to make room: a peer asking
	// from below it cannot be answered in full.
	droppedTo txnid.ID
}

func (g *txnRing) push(inv partition.Invocation, inc uint64) {
	if len(g.txns) < TailKeptMax {
		g.txns = append(g.txns, inv)
		g.incs = append(g.incs, inc)
		return
	}
	g.droppedTo = g.txns[g.head].ID
	g.txns[g.head], g.incs[g.head] = inv, inc
	g.head = (g.head + 1) % len(g.txns)
}

// after returns the kept txns with ID > id sent by incarnation inc or an
// older one, in order.
func (g *txnRing) after(id txnid.ID, inc uint64) []partition.Invocation {
	var out []partition.Invocation
	for i := range g.txns {
		j := (g.head + i) % len(g.txns)
		if inv := g.txns[j]; inv.ID > id && g.incs[j] <= inc {
			out = append(out, inv)
		}
	}
	return out
}
