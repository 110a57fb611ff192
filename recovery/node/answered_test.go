package node

import (
	"context"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/wire"

	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
)

// TestRepairAnswerTakesProcessForDead: a node that gave a peer an
// initiator's tail for a repair does not resume that process's feed
// afterwards. The peer may stop waiting for the process on what it got
// and run on; a feed resumed here would bring txns past it that the peer
// never runs (docs/DESIGN.md "Feeds that resume"). Without the answer,
// the same redial resumes. And a feed of the process still open here is
// closed by the answer, and passes nothing more to the replicas: a peer
// refused while this node was fed used to fail its replicas after its
// retries (rejoin chaos --net-faults on, seed 20261128).
func TestRepairAnswerTakesProcessForDead(t *testing.T) {
	rec := supervise.NodeRecord{ID: "n2", Started: time.Unix(200, 0)}
	inc := uint64(incarnation(rec))
	const in = txnid.Initiator(2)
	newNode := func(t *testing.T) *Node {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		n := &Node{ctx: ctx, log: testLog(t)}
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
		fi.gate = n.feeds.gateLocked(in)
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
		n.answerRepair(in, inc)
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
		near, far := net.Pipe()
		defer far.Close()
		fi := &feedIn{in: in, node: "n2", inc: inc, conn: stream.NewConn(near, stream.Config{}), beat: &beatSlot{}}
		n.feeds.mu.Lock()
		n.feeds.by[in], n.feeds.last[in] = fi, fi
		fi.gate = n.feeds.gateLocked(in)
		n.feeds.mu.Unlock()
		if err := n.takeFeedMsg(fi, &wire.Beat{ID: txnid.Make(10, 0, in)}); err != nil {
			t.Fatalf("before the answer: %v", err)
		}
		n.answerRepair(in, inc)
		if !n.gaveTail(fi) {
			t.Fatal("the answer was not noted")
		}
		if _, err := far.Read(make([]byte, 1)); err == nil {
			t.Fatal("the process's feed is still open after a peer got its tail from here")
		}
		// A heartbeat the reader had buffered would vouch for txns that
		// no longer reach the replicas.
		if err := n.takeFeedMsg(fi, &wire.Beat{ID: txnid.Make(20, 0, in)}); err == nil {
			t.Fatal("a message of the process passed after its tail was given")
		}
		if got := fi.beat.load(); got != txnid.Make(10, 0, in) {
			t.Fatalf("slot at %v after the answer, want %v", got, txnid.Make(10, 0, in))
		}
		// A newer process of the node is not taken for dead with it; nor
		// is a feed of the same process that comes after the answer (it
		// is answered wire.Fenced and taken in again).
		newer := &feedIn{in: in, node: "n2", inc: inc + 1, gate: fi.gate, beat: &beatSlot{}}
		if err := n.takeFeedMsg(newer, &wire.Beat{ID: txnid.Make(30, 0, in)}); err != nil {
			t.Fatalf("a newer process's feed: %v", err)
		}
		again := &feedIn{in: in, node: "n2", inc: inc, gate: fi.gate, born: fi.gate.cuts, beat: &beatSlot{}}
		if err := n.takeFeedMsg(again, &wire.Beat{ID: txnid.Make(40, 0, in)}); err != nil {
			t.Fatalf("the process's feed after it was fenced: %v", err)
		}
		if n.gaveTail(again) {
			t.Fatal("a feed that came after the answer counts it: its break would take the process for dead at once")
		}
	})
}

// TestFeedFloorLostNoFailure: n3's first feed to n2 breaks after n2 sent
// its floor and before n3 read it (the knob stands for a reset then).
// n3 never took that feed for open and sent nothing on it, so it dials
// afresh, without asking to resume; n2 read nothing on the broken feed
// and answers with a floor. It used to fail every replica it hosted ("re-
// opened by the same process without resuming": rejoin chaos --net-faults
// on, seed 20261128).
func TestFeedFloorLostNoFailure(t *testing.T) {
	cfg := layout.Config{Partitions: 2, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	var logs logCatch
	c := newClusterWith(t, 3, 2, cfg, func(c *cluster) {
		c.onLog = func(id int, r slog.Record) {
			if r.Message == "replica failed, needs a rejoin" {
				logs.add("failures", id, r)
			}
		}
	})
	var lost atomic.Int32
	a3 := c.startCfg(3, func(cfg *Config) {
		cfg.knobs.loseFloor = func(node string) bool {
			return node == NodeName(2) && lost.Add(1) == 1
		}
	})
	cl := dialClient(t, a3.TCP)
	waitWritable(t, cl, 2)
	if lost.Load() == 0 {
		t.Fatal("no floor was lost")
	}
	for i := range 200 {
		upsert(t, cl, 2, i)
	}
	checkDigests(t, cl, 2, 3)
	if fs := logs.seen("failures"); len(fs) > 0 {
		t.Fatalf("replicas failed: %v", fs)
	}
}
