package node

import (
	"slices"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
)

// TestMissedByCountsOnlyThisOutage: what a process's feed hellos said it
// missed counts in a settlement only if said since the outage began: the
// node's reading of its feeds (settleRead) and recovery.Settle.
// Rejoin chaos seed 31337 (10 minutes): n4 restarted, n2's process told
// its new feed there that it had written five partitions while n4 was
// down, and n4 rebuilt them. Later n4 lapsed, and that n2 process, which
// had re-registered meanwhile and whose feed ended just before, was taken
// to have missed the five partitions again: n4 failed them, and with
// them the last live replica of partition 1.
func TestMissedByCountsOnlyThisOutage(t *testing.T) {
	started := func(sec int64) time.Time { return time.Unix(sec, 0) }
	old := supervise.NodeRecord{ID: "n2", Started: started(100)}
	cur := supervise.NodeRecord{ID: "n2", Started: started(200)}
	oldInc, curInc := uint64(incarnation(old)), uint64(incarnation(cur))

	newNode := func(alive ...supervise.NodeRecord) *Node {
		n := &Node{}
		n.members.n = n
		n.members.v = &view{nodes: map[string]supervise.NodeRecord{}}
		for _, rec := range alive {
			n.members.v.nodes[rec.ID] = rec
		}
		n.feeds = feedIns{n: n, by: map[txnid.Initiator]*feedIn{}, told: map[string]map[uint64][]toldHello{}}
		return n
	}
	tell := func(n *Node, inc uint64, missed ...uint32) {
		n.feeds.mu.Lock()
		n.feeds.tellLocked("n2", inc, missed)
		n.feeds.mu.Unlock()
	}
	begin := func(n *Node) *outage {
		feeds, tells := n.feedsNow()
		return &outage{feeds: feeds, tellsFrom: tells}
	}

	for _, tc := range []struct {
		name  string
		setup func(n *Node) *outage
		alive []supervise.NodeRecord
		want  []uint32
		ok    bool
	}{
		{
			name: "told before the outage, by a process whose feed ended before it",
			setup: func(n *Node) *outage {
				tell(n, oldInc, 1, 2, 3, 6, 7)
				return begin(n)
			},
			want: nil, ok: true,
		},
		{
			name: "told since the outage, by a process dead now",
			setup: func(n *Node) *outage {
				tell(n, oldInc, 1, 2)
				out := begin(n)
				tell(n, oldInc, 6)
				return out
			},
			want: []uint32{6}, ok: true,
		},
		{
			name: "never told: it cannot say",
			setup: func(n *Node) *outage {
				return begin(n)
			},
			want: nil, ok: false,
		},
		{
			name: "the live process told twice since the outage, on a feed that broke and on the open one",
			setup: func(n *Node) *outage {
				out := begin(n)
				tell(n, oldInc)
				tell(n, curInc, 3)
				tell(n, curInc)
				n.feeds.by[2] = &feedIn{in: 2, node: "n2", inc: curInc}
				return out
			},
			alive: []supervise.NodeRecord{cur},
			want:  []uint32{3}, ok: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(tc.alive...)
			out := tc.setup(n)
			in := &recovery.SettleInput{Lapsed: true, Meanwhile: []recovery.SettleProcess{{Node: "n2", Inc: oldInc}}, Expired: map[string]bool{}}
			conns := map[*feedIn]uint64{}
			in.Before = settleFeeds(out.feeds, conns)
			n.settleRead(in, conns, out.tellsFrom)
			o := recovery.Settle(in)
			if o.Verdict == recovery.SettleWait {
				t.Fatalf("settlement waits for %s", o.WaitFor)
			}
			var got []uint32
			for p, by := range o.Missed {
				if slices.Contains(by, "n2") {
					got = append(got, p)
				}
			}
			ok := !slices.Contains(o.Unknown, "n2")
			slices.Sort(got)
			if ok != tc.ok || !slices.Equal(got, tc.want) {
				t.Fatalf("n2 missed %v, known %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
