package node

import (
	"context"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
)

// TestRepairAnswerTakesProcessForDead: a node that gave a peer an
// initiator's tail for a repair does not resume that process's feed
// afterwards. The peer may stop waiting for the process on what it got
// and run on; a feed resumed here would bring txns past it that the peer
// never runs (docs/DESIGN.md "Feeds that resume"). Without the answer,
// the same redial resumes. And a feed of the process open here refuses
// the peer's repair.
func TestRepairAnswerTakesProcessForDead(t *testing.T) {
	rec := supervise.NodeRecord{ID: "n2", Started: time.Unix(200, 0)}
	inc := uint64(incarnation(rec))
	const in = txnid.Initiator(2)
	newNode := func(t *testing.T) *Node {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		n := &Node{ctx: ctx}
		n.members.n = n
		n.members.v = &view{nodes: map[string]supervise.NodeRecord{"n2": rec}}
		n.feeds = feedIns{n: n, by: map[txnid.Initiator]*feedIn{}, last: map[txnid.Initiator]*feedIn{}}
		return n
	}
	// ended adds a feed of n2's process that ended here, and runs its
	// feedLost; redial is then what a new feed of the same process does.
	ended := func(n *Node) (fi *feedIn, redial func()) {
		fi = &feedIn{in: in, node: "n2", inc: inc, resolved: make(chan struct{}), redialled: make(chan struct{}), beat: &beatSlot{}}
		n.feeds.mu.Lock()
		n.feeds.last[in] = fi
		n.feeds.mu.Unlock()
		go n.feedLost(fi)
		return fi, func() { close(fi.redialled) }
	}
	wait := func(t *testing.T, fi *feedIn) {
		t.Helper()
		select {
		case <-fi.resolved:
		case <-time.After(5 * time.Second):
			t.Fatal("the ended feed is not resolved 5 s after the redial")
		}
	}

	t.Run("answered", func(t *testing.T) {
		n := newNode(t)
		fi, redial := ended(n)
		if !n.answerRepair(in, inc) {
			t.Fatal("repair refused with no feed of the process open")
		}
		redial()
		wait(t, fi)
		if !fi.untracked {
			t.Fatal("the redial would resume a feed whose tail was given to a peer's repair")
		}
	})
	t.Run("not answered", func(t *testing.T) {
		n := newNode(t)
		fi, redial := ended(n)
		time.Sleep(100 * time.Millisecond) // feedLost holds: the process lives
		redial()
		wait(t, fi)
		if fi.untracked {
			t.Fatal("the replicas stopped waiting for a live process that only redialled")
		}
	})
	t.Run("own process", func(t *testing.T) {
		// n2's view has lost n2 itself (its registration lapsed): its feed
		// to itself, which ended, is still its own process's, never taken
		// for dead here (chaos seed 542202860: a node slow for a second
		// repaired and fenced its own initiator, and its peers failed
		// their replicas repairing one that was back).
		n := newNode(t)
		n.id, n.started = "n2", rec.Started
		delete(n.members.v.nodes, "n2")
		fi, redial := ended(n)
		time.Sleep(100 * time.Millisecond)
		redial()
		wait(t, fi)
		if fi.untracked {
			t.Fatal("a node stopped waiting for its own initiator")
		}
	})
	t.Run("open", func(t *testing.T) {
		n := newNode(t)
		n.feeds.by[in] = &feedIn{in: in, node: "n2", inc: inc}
		if n.answerRepair(in, inc) || n.answeredRepair(in, inc) {
			t.Fatal("repair answered while a feed of the process is open here")
		}
	})
}
