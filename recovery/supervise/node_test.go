package supervise

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/stream/faultnet"
)

// lossSlack is what a test allows past a one-window promise for the
// machine: scheduling and a local etcd round trip on two shared cores
// under -race. Measured values are logged.
const lossSlack = 400 * time.Millisecond

func TestNodeRegisterAndClose(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	n, err := Register(ctx, cli, "n1", NodeOptions{Address: "127.0.0.1:7001", TTL: 2 * time.Second, Window: 400 * time.Millisecond, OutgoingMax: 3, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := Nodes(ctx, cli)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes %v, %v", nodes, err)
	}
	first := nodes[0]
	if first.ID != "n1" || first.Address != "127.0.0.1:7001" || first.Status != NodeReady || first.OutgoingMax != 3 || first.Lease != int64(n.Lease()) {
		t.Fatalf("record %+v", first)
	}
	// Activity updates move LastActive on, keeping the lease.
	waitFor(t, 2*time.Second, "an activity update", func() bool {
		nodes, err := Nodes(ctx, cli)
		return err == nil && len(nodes) == 1 && nodes[0].LastActive.After(first.LastActive) && nodes[0].Lease == first.Lease
	})
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(n.Err(), ErrNodeLost) {
		t.Fatalf("err after close: %v", n.Err())
	}
	if nodes, err := Nodes(ctx, cli); err != nil || len(nodes) != 0 {
		t.Fatalf("after close: %v, %v", nodes, err)
	}
}

// TestNodeUnreachable: with etcd stopped, the node's term ends within its
// window (DESIGN.md, "Without the coordinator"), before its lease could expire, and the claims it
// holds are given up (their Lost closes); the Node itself lives on, and
// once etcd is back it registers again by itself (DESIGN.md, "Without the coordinator": it rejoins
// the cluster when communication is restored).
func TestNodeUnreachable(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	const window = 500 * time.Millisecond
	n, err := Register(ctx, cli, "n1", NodeOptions{TTL: 2 * time.Second, Window: window, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(ctx)
	first := n.Term()
	// A claim with a long window of its own, so that it is the node that
	// gives it up, not the claim's own checks.
	c, err := claim.Acquire(ctx, cli, task13, claim.NewExecutorID(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Hold(c); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	e.Stop()
	select {
	case <-first.Done():
	case <-time.After(window + lossSlack):
		t.Fatalf("term still on %s after etcd stopped", time.Since(stopped))
	}
	took := time.Since(stopped)
	t.Logf("node gave up %s after etcd stopped (window %s, lease TTL 2s)", took, window)
	if !errors.Is(first.Err(), ErrUnreachable) || n.Registered() {
		t.Fatalf("cause %v (registered %v), want ErrUnreachable", first.Err(), n.Registered())
	}
	select {
	case <-c.Lost():
	case <-time.After(2 * time.Second):
		t.Fatal("held claim not given up")
	}
	if err := n.Err(); err != nil {
		t.Fatalf("node ended: %v", err)
	}
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	next, err := n.NextTerm(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("registered again %s after etcd stopped: term %d, lapses %d", time.Since(stopped), next.Seq, next.Lapses)
	if next.Seq != 2 || next.Context().Err() != nil {
		t.Fatalf("next term %+v, err %v", next, next.Err())
	}
	if _, ok := nodeRecord(t, ctx, cli, "n1"); !ok {
		t.Fatal("no record after registering again")
	}
}

// TestNodeRecordRemoved: a node whose record is deleted (the health task
// removing it) loses its term at its next activity update, then
// registers again with a new record; its next term counts a lapse.
func TestNodeRecordRemoved(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	n, err := Register(ctx, cli, "n1", NodeOptions{TTL: 2 * time.Second, Window: 400 * time.Millisecond, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(ctx)
	first := n.Term()
	if _, err := cli.Delete(ctx, NodeKey("n1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first.Done():
	case <-time.After(400*time.Millisecond + lossSlack):
		t.Fatal("node did not notice its record removed")
	}
	if !errors.Is(first.Err(), ErrNodeLost) || errors.Is(first.Err(), ErrUnreachable) {
		t.Fatalf("cause %v", first.Err())
	}
	next, err := n.NextTerm(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if next.Lapses != first.Lapses+1 || next.Created == first.Created || next.Lease == first.Lease {
		t.Fatalf("term after the removal %+v, first %+v", next, first)
	}
}

// TestNodeShortOutageResumesLease: etcd out of reach for more than the
// window but less than the lease TTL: the term ends (claims given up),
// and the next one resumes the same lease and record, with no lapse, so
// no other node took this one for dead.
func TestNodeShortOutageResumesLease(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	ctx := testCtx(t, 20*time.Second)
	n, px, _ := registerBehindProxy(t, ctx, e, 4*time.Second, 500*time.Millisecond)
	first := n.Term()
	px.Freeze()
	select {
	case <-first.Done():
	case <-time.After(500*time.Millisecond + lossSlack):
		t.Fatal("term did not end within its window")
	}
	// Another client writes meanwhile: the record still stands at that
	// revision, and the resumed term says the node was registered then.
	resp, err := newClient(t, e).Put(ctx, "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	px.Thaw()
	next, err := n.NextTerm(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if next.Lapses != first.Lapses || next.Lease != first.Lease || next.Created != first.Created {
		t.Fatalf("term after a short outage %+v, first %+v: want the same lease and record", next, first)
	}
	if rev := next.Revision(); rev < resp.Header.Revision || rev < first.Revision() {
		t.Fatalf("resumed term registered at revision %d, want at least %d: the record stood then (created %d, the first term's last %d)",
			rev, resp.Header.Revision, next.Created, first.Revision())
	}
}

// TestNodeFencedWhileCutOffDropsItsLease: a node cut from etcd, its
// record removed meanwhile (as a fence does), registers anew once etcd
// answers; what it wrote on its old lease (its reports of silent nodes)
// is gone when it is registered again, not a TTL later. Left standing, a
// report filed before the fence counted toward a fence after the node
// was back and heard the suspect again (the fencing model, seed 341).
func TestNodeFencedWhileCutOffDropsItsLease(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	direct := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	n, px, cli := registerBehindProxy(t, ctx, e, 6*time.Second, 500*time.Millisecond)
	first := n.Term()
	if err := PutReport(ctx, cli, first.Lease, "n1", "n2", 7); err != nil {
		t.Fatal(err)
	}
	px.Freeze()
	select {
	case <-first.Done():
	case <-time.After(500*time.Millisecond + lossSlack):
		t.Fatal("term did not end within its window")
	}
	if !errors.Is(first.Err(), ErrUnreachable) {
		t.Fatalf("first term ended by %v, want ErrUnreachable", first.Err())
	}
	if _, err := direct.Delete(ctx, NodeKey("n1")); err != nil {
		t.Fatal(err)
	}
	px.Thaw()
	next, err := n.NextTerm(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if next.Lease == first.Lease {
		t.Fatalf("registered again on the old lease %x, whose record was removed", next.Lease)
	}
	resp, err := direct.Get(ctx, ReportKey("n2", "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		ttl, _ := direct.TimeToLive(ctx, first.Lease)
		t.Fatalf("registered again with the report of its old lease standing (that lease's TTL left: %d s)", ttl.TTL)
	}
}

// TestNodeLeaseSafeUntil: a term says a time before which etcd keeps its
// lease, moved on by each renewal while etcd answers and left alone once
// it does not. Cut from etcd, the node's lease is still there, read
// directly, just before that time, and gone some time after it.
func TestNodeLeaseSafeUntil(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	direct := newClient(t, e)
	ctx := testCtx(t, 30*time.Second)
	const ttl = 3 * time.Second
	n, px, _ := registerBehindProxy(t, ctx, e, ttl, 500*time.Millisecond)
	first := n.Term()
	granted := first.LeaseSafeUntil()
	if until := time.Until(granted); until <= 0 || until > ttl {
		t.Fatalf("LeaseSafeUntil %v from now at registration, want within the TTL %v", until, ttl)
	}
	time.Sleep(time.Second)
	safe := first.LeaseSafeUntil()
	if !safe.After(granted) {
		t.Fatalf("LeaseSafeUntil %v not moved on from %v by a second of renewals", safe, granted)
	}
	px.Freeze()
	select {
	case <-first.Done():
	case <-time.After(500*time.Millisecond + lossSlack):
		t.Fatal("term did not end within its window")
	}
	safe = first.LeaseSafeUntil()
	t.Logf("cut from etcd: the lease safe for %v more", time.Until(safe).Round(time.Millisecond))
	// Just before it, by a margin for the etcd lease checker's and this
	// test's own scheduling only: the lease must stand.
	time.Sleep(time.Until(safe.Add(-100 * time.Millisecond)))
	ttlResp, err := direct.TimeToLive(ctx, first.Lease)
	if err != nil {
		t.Fatal(err)
	}
	if ttlResp.TTL < 0 { // -1: expired (0 is a remaining TTL below a second)
		t.Fatalf("the lease gone %v before LeaseSafeUntil", time.Until(safe))
	}
	waitFor(t, 2*ttl, "the lease to expire", func() bool {
		r, err := direct.TimeToLive(ctx, first.Lease)
		return err == nil && r.TTL < 0
	})
	t.Logf("the lease expired %v after LeaseSafeUntil", time.Since(safe).Round(time.Millisecond))
	px.Thaw()
}

// TestNodeSuperseded: a newer process registering under the same id ends
// the older one's Node for good (two processes must not share an id),
// and the older one's Close leaves the newer record alone.
func TestNodeSuperseded(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	old, err := Register(ctx, cli, "n1", NodeOptions{TTL: 2 * time.Second, Window: 400 * time.Millisecond, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	n, err := Register(ctx, cli, "n1", NodeOptions{TTL: 2 * time.Second, Window: 400 * time.Millisecond, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(ctx)
	select {
	case <-old.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the older incarnation did not stop")
	}
	if !errors.Is(old.Err(), ErrSuperseded) {
		t.Fatalf("cause %v, want ErrSuperseded", old.Err())
	}
	if err := old.Close(ctx); err != nil {
		t.Fatal(err)
	}
	r, ok := nodeRecord(t, ctx, cli, "n1")
	if !ok || r.Created != n.Term().Created || !n.Registered() {
		t.Fatalf("newer record %+v (present %v) after the older one closed", r, ok)
	}
}

// nodeRecord reads n1's record; ok false when there is none.
func nodeRecord(t *testing.T, ctx context.Context, cli *clientv3.Client, id string) (NodeRecord, bool) {
	t.Helper()
	nodes, err := Nodes(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range nodes {
		if r.ID == id {
			return r, true
		}
	}
	return NodeRecord{}, false
}

// TestNodeOutageLapsedRegistersAgain: etcd out of the node's reach (its
// client's traffic frozen by a proxy) for 3 x its lease TTL, so the lease
// expires in etcd: the node gives its claims up within its window, but
// the registration is not ended for good: once etcd answers it registers
// again (a new record, the process's Started kept) and goes on updating.
func TestNodeOutageLapsedRegistersAgain(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	watch := newClient(t, e)
	ctx := testCtx(t, 30*time.Second)
	const ttl, window = 2 * time.Second, 500 * time.Millisecond
	n, px, cli := registerBehindProxy(t, ctx, e, ttl, window)
	before, ok := nodeRecord(t, ctx, watch, "n1")
	if !ok {
		t.Fatal("no record after Register")
	}
	c, err := claim.Acquire(ctx, cli, task13, claim.NewExecutorID(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Hold(c); err != nil {
		t.Fatal(err)
	}
	px.Freeze()
	frozen := time.Now()
	select {
	case <-c.Lost():
		t.Logf("held claim given up %s after etcd went out of reach (window %s)", time.Since(frozen), window)
	case <-time.After(window + lossSlack + giveUpTimeout):
		t.Fatal("held claim not given up within the window")
	}
	waitFor(t, 3*ttl+2*time.Second, "the lease to expire in etcd", func() bool {
		_, ok := nodeRecord(t, ctx, watch, "n1")
		return !ok
	})
	time.Sleep(3*ttl - time.Since(frozen))
	if err := n.Err(); err != nil {
		t.Fatalf("registration ended for good while etcd was out of reach: %v", err)
	}
	px.Thaw()
	thawed := time.Now()
	var again NodeRecord
	waitFor(t, 10*time.Second, "the node registered again", func() bool {
		r, ok := nodeRecord(t, ctx, watch, "n1")
		again = r
		return ok
	})
	t.Logf("registered again %s after etcd answered", time.Since(thawed))
	if again.Created == before.Created || !again.Started.Equal(before.Started) {
		t.Fatalf("record after the lapse %+v, before %+v: want a new key with the same Started", again, before)
	}
	// It stays registered: its updates pass.
	waitFor(t, 3*time.Second, "an activity update of the new record", func() bool {
		r, ok := nodeRecord(t, ctx, watch, "n1")
		return ok && r.Created == again.Created && r.LastActive.After(again.LastActive)
	})
	if err := n.Err(); err != nil {
		t.Fatalf("registration ended: %v", err)
	}
}

// TestNodeReregisterOverLiveEarlierIncarnation (issue 10 item 1): a node
// restarted before its earlier incarnation's lease expired registers over
// that record and stays registered through its activity updates.
func TestNodeReregisterOverLiveEarlierIncarnation(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	ctx := testCtx(t, 20*time.Second)
	const window = 400 * time.Millisecond
	// The earlier incarnation dies without a word: its client closes, its
	// lease lives on for its TTL.
	oldCli := newClient(t, e)
	old, err := Register(ctx, oldCli, "n1", NodeOptions{TTL: 4 * time.Second, Window: window, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	oldCli.Close()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = old.Close(cctx)
	}()
	cli := newClient(t, e)
	n, err := Register(ctx, cli, "n1", NodeOptions{TTL: 4 * time.Second, Window: window, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(ctx)
	first, ok := nodeRecord(t, ctx, cli, "n1")
	if !ok {
		t.Fatal("no record")
	}
	// Several windows of updates: every one must land on the same record.
	deadline := time.Now().Add(4 * window)
	for time.Now().Before(deadline) {
		select {
		case <-n.Done():
			t.Fatalf("registration over the earlier incarnation lost: %v", n.Err())
		case <-time.After(50 * time.Millisecond):
		}
		r, ok := nodeRecord(t, ctx, cli, "n1")
		if !ok || r.Created != first.Created {
			t.Fatalf("record %+v (present %v), want the one created at %d", r, ok, first.Created)
		}
	}
	last, _ := nodeRecord(t, ctx, cli, "n1")
	if !last.LastActive.After(first.LastActive) {
		t.Fatalf("no activity update landed: %v then %v", first.LastActive, last.LastActive)
	}
}

// TestReplicasBetweenPlaced: ReplicasBetween's placed, the nodes whose
// replica record of a partition was created or deleted between two
// revisions (a move: one deleted, one created), not those whose record only changed state; the read ends at
// the node record write given as its end, and a history compacted past
// its start is etcd's ErrCompacted.
func TestReplicasBetweenPlaced(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	put := putRev(t, ctx, cli)
	live, failed := `{"state":"live"}`, `{"state":"needs-rejoin"}`
	for _, node := range []string{"n1", "n2", "n3"} {
		put(ReplicaKey(1, node), live)
		put(ReplicaKey(2, node), live)
	}
	before := put(NodeKey("n9"), `{}`)
	put(ReplicaKey(2, "n1"), failed)
	if _, err := cli.Delete(ctx, ReplicaKey(1, "n2")); err != nil {
		t.Fatal(err)
	}
	put(ReplicaKey(1, "n4"), live)
	upto := put(NodeKey("n9"), `{"x":1}`)
	put(ReplicaKey(2, "n5"), live) // after upto: not read
	got, _, err := ReplicasBetween(ctx, cli, before, upto)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !slices.Equal(got[1], []string{"n2", "n4"}) {
		t.Fatalf("placed = %v, want partition 1: n2, n4", got)
	}
	if got, _, err := ReplicasBetween(ctx, cli, upto, upto); err != nil || len(got) != 0 {
		t.Fatalf("placed of an empty span = %v, %v", got, err)
	}
	if _, err := cli.Compact(ctx, upto); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReplicasBetween(ctx, cli, before, upto); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("ReplicasBetween past a compaction: %v, want ErrCompacted", err)
	}
}

// TestReplicasBetweenLive: ReplicasBetween's live, the nodes whose
// replica of a partition was live for the cluster (record live, node registered) at some revision between two
// revisions, the first included: a live record of a node not registered
// counts from the node's registration, one failed before the span does
// not count, one live at its start does though it failed since, one gone
// live within the span does, and nothing after the span's end is read.
func TestReplicasBetweenLive(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 20*time.Second)
	put := putRev(t, ctx, cli)
	node := `{"status":"ready"}`
	live, failed := `{"state":"live"}`, `{"state":"needs-rejoin"}`
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		put(ReplicaKey(1, n), live)
		put(ReplicaKey(2, n), live)
	}
	put(NodeKey("n1"), node)
	put(NodeKey("n2"), node)
	put(NodeKey("n9"), node)
	put(ReplicaKey(1, "n2"), failed) // failed before the span
	after := put(NodeKey("n9"), node)
	n1Failed := put(ReplicaKey(2, "n1"), failed) // live at the span's start
	put(ReplicaKey(1, "n2"), live)               // live again within it
	put(NodeKey("n3"), node)                     // n3 registers: its records say live
	del, err := cli.Delete(ctx, NodeKey("n3"))
	if err != nil {
		t.Fatal(err)
	}
	n3Gone := del.Header.Revision
	// n4's record goes needs-rejoin before n4 registers: never live.
	put(ReplicaKey(1, "n4"), failed)
	put(ReplicaKey(2, "n4"), failed)
	put(NodeKey("n4"), node)
	upto := put(NodeKey("n9"), node)
	put(ReplicaKey(2, "n4"), live) // after upto: not read
	_, last, err := ReplicasBetween(ctx, cli, after, upto)
	if err != nil {
		t.Fatal(err)
	}
	got := last.Since(after)
	want := map[uint32][]string{1: {"n1", "n2", "n3"}, 2: {"n1", "n2", "n3"}}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("live = %v, want %v", got, want)
	}
	// The last revision each was live at: until the span's end, or just
	// before the write that ended it.
	wantLast := LastLive{1: {"n1": upto, "n2": upto, "n3": n3Gone - 1}, 2: {"n1": n1Failed - 1, "n2": upto, "n3": n3Gone - 1}}
	if !maps.EqualFunc(last, wantLast, maps.Equal) {
		t.Fatalf("last live = %v, want %v", last, wantLast)
	}
	// Since a revision: only those live at or after it.
	want = map[uint32][]string{1: {"n1", "n2", "n3"}, 2: {"n2", "n3"}}
	if got := last.Since(n1Failed); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("live since revision %d = %v, want %v", n1Failed, got, want)
	}
	_, last, err = ReplicasBetween(ctx, cli, upto, upto)
	want = map[uint32][]string{1: {"n1", "n2"}, 2: {"n2"}}
	if got := last.Since(upto); err != nil || !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("live at one revision = %v, %v; want %v", got, err, want)
	}
	if _, err := cli.Compact(ctx, upto); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReplicasBetween(ctx, cli, after, upto); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("ReplicasBetween past a compaction: %v, want ErrCompacted", err)
	}
}

// putRev returns a put through cli on ctx that returns the revision it
// wrote at.
func putRev(t *testing.T, ctx context.Context, cli *clientv3.Client) func(key, val string) int64 {
	return func(key, val string) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, key, val)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
}

// registerBehindProxy registers node n1 on a client whose traffic to e
// goes through a proxy the test can freeze, and at the test's end closes
// the node, then the proxy.
func registerBehindProxy(t *testing.T, ctx context.Context, e *claim.Embedded, ttl, window time.Duration) (*Node, *faultnet.Proxy, *clientv3.Client) {
	t.Helper()
	px, err := faultnet.Start(e.Endpoints()[0][len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	cli := newClientAt(t, px.Endpoint())
	n, err := Register(ctx, cli, "n1", NodeOptions{TTL: ttl, Window: window, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = n.Close(cctx)
	})
	return n, px, cli
}
