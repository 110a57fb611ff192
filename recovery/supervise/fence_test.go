package supervise

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery"
)

// TestFencesDue: a process is due for a fence when a majority of the
// other registered nodes report it, as that process; a report from a node
// not registered, or on an older process, or on oneself, counts for
// nothing, and a node cut off from all the others fences no one.
func TestFencesDue(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(s, 0).UTC() }
	nodes := func(ids ...string) map[string]NodeRecord {
		m := map[string]NodeRecord{}
		for i, id := range ids {
			m[id] = NodeRecord{ID: id, Started: at(int64(100 + i))}
		}
		return m
	}
	rep := func(suspect, reporter string, inc int64) (string, Report) {
		return ReportKey(suspect, reporter), Report{Suspect: suspect, Reporter: reporter, Inc: inc}
	}
	five := nodes("n1", "n2", "n3", "n4", "n5")
	for _, tc := range []struct {
		name    string
		nodes   map[string]NodeRecord
		reports [][2]string // suspect, reporter
		inc     map[[2]string]int64
		placed  []string
		want    []string
	}{
		{name: "none", nodes: five},
		{name: "two of four", nodes: five, reports: [][2]string{{"n2", "n1"}, {"n2", "n3"}}},
		{name: "three of four", nodes: five, reports: [][2]string{{"n2", "n1"}, {"n2", "n3"}, {"n2", "n4"}}, want: []string{"n2"}},
		// n2 cut off reports every other node; they report it.
		{name: "one cut off", nodes: five, reports: [][2]string{
			{"n1", "n2"}, {"n3", "n2"}, {"n4", "n2"}, {"n5", "n2"},
			{"n2", "n1"}, {"n2", "n3"}, {"n2", "n4"}, {"n2", "n5"}}, want: []string{"n2"}},
		// A 2|3 split: the three fence the two, not the other way.
		{name: "minority", nodes: five, reports: [][2]string{
			{"n3", "n1"}, {"n4", "n1"}, {"n5", "n1"}, {"n3", "n2"}, {"n4", "n2"}, {"n5", "n2"},
			{"n1", "n3"}, {"n1", "n4"}, {"n1", "n5"}, {"n2", "n3"}, {"n2", "n4"}, {"n2", "n5"}}, want: []string{"n1", "n2"}},
		{name: "unregistered reporter", nodes: nodes("n1", "n2", "n3"), reports: [][2]string{{"n2", "n1"}, {"n2", "n9"}}},
		{name: "self report", nodes: nodes("n1", "n2", "n3"), reports: [][2]string{{"n2", "n1"}, {"n2", "n2"}}},
		{name: "older process", nodes: five, reports: [][2]string{{"n2", "n1"}, {"n2", "n3"}, {"n2", "n4"}},
			inc: map[[2]string]int64{{"n2", "n4"}: 7}},
		// Two nodes: each alone is a majority of the other's peers; the
		// transaction's guard keeps them from fencing each other
		// (TestFenceNode).
		{name: "two nodes", nodes: nodes("n1", "n2"), reports: [][2]string{{"n2", "n1"}}, want: []string{"n2"}},
		// n2 holds replicas but is not registered (dead, or fenced):
		// it still counts among n3's peers, so n1 alone is no majority.
		{name: "one gone", nodes: nodes("n1", "n3"), placed: []string{"n1", "n2", "n3"}, reports: [][2]string{{"n3", "n1"}}},
		{name: "one gone, both", nodes: nodes("n1", "n3", "n4"), placed: []string{"n1", "n2", "n3", "n4"}, reports: [][2]string{{"n3", "n1"}, {"n3", "n4"}}, want: []string{"n3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Membership{Nodes: tc.nodes, Reports: map[string]Report{}, Replicas: map[string]Replica{}}
			for _, id := range tc.placed {
				m.Replicas[ReplicaKey(0, id)] = Replica{Partition: 0, Node: id, State: recovery.ReplicaLive}
			}
			for _, r := range tc.reports {
				i, ok := tc.inc[r]
				if !ok {
					i = tc.nodes[r[0]].Started.UnixNano()
				}
				k, v := rep(r[0], r[1], i)
				m.Reports[k] = v
			}
			var got []string
			for _, d := range FencesDue(m) {
				got = append(got, d.Node)
				for _, r := range d.Reporters {
					if _, ok := m.Nodes[r]; !ok || r == d.Node {
						t.Errorf("%s reported by %s, not another registered node", d.Node, r)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("FencesDue = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDueOnceReported: a fenced node that reaches some of the others may
// come back when its own report would complete the fence of each node it
// cannot reach, and only with the nodes it reaches a majority of the
// cluster (docs/DESIGN.md "Fencing by the peers' word").
func TestDueOnceReported(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(s, 0).UTC() }
	m := func(registered []string, placed []string, reports ...[2]string) *Membership {
		mm := &Membership{Nodes: map[string]NodeRecord{}, Reports: map[string]Report{}, Replicas: map[string]Replica{}}
		for i, id := range registered {
			mm.Nodes[id] = NodeRecord{ID: id, Started: at(int64(100 + i))}
		}
		for _, id := range placed {
			mm.Replicas[ReplicaKey(0, id)] = Replica{Partition: 0, Node: id, State: recovery.ReplicaLive}
		}
		for _, r := range reports {
			mm.Reports[ReportKey(r[0], r[1])] = Report{Suspect: r[0], Reporter: r[1], Inc: mm.Nodes[r[0]].Started.UnixNano()}
		}
		return mm
	}
	all5 := []string{"n1", "n2", "n3", "n4", "n5"}
	// n4 fenced; {n1,n2}|{n3,n4,n5}: n3 and n5 report n1 and n2.
	split := m([]string{"n1", "n2", "n3", "n5"}, all5, [2]string{"n1", "n3"}, [2]string{"n1", "n5"}, [2]string{"n2", "n3"}, [2]string{"n2", "n5"})
	for _, tc := range []struct {
		name     string
		m        *Membership
		reached  []string
		suspects []string
		want     bool
	}{
		{name: "2|3 split, fenced node on the three's side", m: split, reached: []string{"n3", "n5"}, suspects: []string{"n1", "n2"}, want: true},
		{name: "2|3 split, fenced node on the two's side", m: split, reached: []string{"n1"}, suspects: []string{"n3", "n5"}},
		{name: "one suspect not reported", m: split, reached: []string{"n3", "n5"}, suspects: []string{"n1", "n2", "n9"}},
		{name: "a suspect it reaches", m: split, reached: []string{"n3", "n5", "n1"}, suspects: []string{"n1"}},
		{name: "reported by one of four", m: m([]string{"n1", "n2", "n3", "n5"}, all5, [2]string{"n1", "n3"}), reached: []string{"n3", "n5"}, suspects: []string{"n1"}},
		{name: "no report", m: m([]string{"n1", "n2", "n3", "n5"}, all5), reached: []string{"n3", "n5"}, suspects: []string{"n1"}},
		{name: "no suspect", m: split, reached: []string{"n3", "n5"}},
		// A bridge of three: n1, fenced, reaches n2 and not n3, which
		// n2 reaches: nobody reports n3, and n1 stays out.
		{name: "bridge of three", m: m([]string{"n2", "n3"}, []string{"n1", "n2", "n3"}, [2]string{"n1", "n3"}), reached: []string{"n2"}, suspects: []string{"n3"}},
		// Two nodes: n1 alone is a majority of n2's peers, but not of
		// the cluster.
		{name: "two nodes", m: m([]string{"n2"}, []string{"n1", "n2"}, [2]string{"n1", "n2"}), suspects: []string{"n2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DueOnceReported(tc.m, "n4", tc.reached, tc.suspects); got != tc.want {
				t.Errorf("DueOnceReported(n4, reached %v, suspects %v) = %v, want %v", tc.reached, tc.suspects, got, tc.want)
			}
		})
	}
}

// TestCutDue: reports that no majority backs name one node to fence,
// the one with the most reports made and received, ties to the greatest
// id, until none stands between registered nodes (docs/DESIGN.md "A cut
// between two nodes"); a majority due, or a pick nobody reports, names
// none.
func TestCutDue(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(s, 0).UTC() }
	all5 := []string{"n1", "n2", "n3", "n4", "n5"}
	m := func(registered []string, reports ...[2]string) *Membership {
		mm := &Membership{Nodes: map[string]NodeRecord{}, Reports: map[string]Report{}, Replicas: map[string]Replica{}}
		for i, id := range all5 {
			mm.Replicas[ReplicaKey(0, id)] = Replica{Partition: 0, Node: id, State: recovery.ReplicaLive}
			if slices.Contains(registered, id) {
				mm.Nodes[id] = NodeRecord{ID: id, Started: at(int64(100 + i))}
			}
		}
		for _, r := range reports {
			mm.Reports[ReportKey(r[0], r[1])] = Report{Suspect: r[0], Reporter: r[1], Inc: at(int64(100 + slices.Index(all5, r[0]))).UnixNano()}
		}
		return mm
	}
	// {n1,n4} | {n2,n3}, n5 the bridge: each side reports the other.
	bridge := [][2]string{
		{"n2", "n1"}, {"n3", "n1"}, {"n2", "n4"}, {"n3", "n4"},
		{"n1", "n2"}, {"n4", "n2"}, {"n1", "n3"}, {"n4", "n3"}}
	for _, tc := range []struct {
		name      string
		m         *Membership
		want      string
		reporters []string
	}{
		{name: "no report", m: m(all5)},
		{name: "single link", m: m(all5, [2]string{"n2", "n3"}, [2]string{"n3", "n2"}), want: "n3", reporters: []string{"n2"}},
		{name: "bridge", m: m(all5, bridge...), want: "n4", reporters: []string{"n2", "n3"}},
		// n4 fenced: its reports no longer count, and the other node of
		// its side is the one left between the two.
		{name: "bridge, one side's first fenced", m: m([]string{"n1", "n2", "n3", "n5"}, bridge...), want: "n1", reporters: []string{"n2", "n3"}},
		{name: "bridge, one side fenced", m: m([]string{"n2", "n3", "n5"}, bridge...)},
		// n1 cut off from every peer, one of whose reports of it is in:
		// it reports all four, so it is the pick, not n5, greater but
		// reported once and reporting once.
		{name: "one cut off, reports coming in", m: m(all5,
			[2]string{"n2", "n1"}, [2]string{"n3", "n1"}, [2]string{"n4", "n1"}, [2]string{"n5", "n1"}, [2]string{"n1", "n5"}), want: "n1", reporters: []string{"n5"}},
		{name: "a majority due", m: m(all5,
			[2]string{"n1", "n2"}, [2]string{"n1", "n3"}, [2]string{"n1", "n4"}, [2]string{"n2", "n3"}, [2]string{"n3", "n2"})},
		// n3 hears nothing from n2, which hears it: of the two, one
		// report each, the one reported is the pick, not the greater id.
		{name: "one way, the lesser id reported", m: m(all5, [2]string{"n2", "n3"}), want: "n2", reporters: []string{"n3"}},
		{name: "one way", m: m(all5, [2]string{"n3", "n2"}), want: "n3", reporters: []string{"n2"}},
		{name: "reporter not registered", m: m([]string{"n1", "n3", "n4", "n5"}, [2]string{"n2", "n3"}, [2]string{"n3", "n2"})},
		// n1 and n2 out, and n3, n4 and n5 all report each other: a fence
		// would leave two of five registered.
		{name: "no majority left", m: m([]string{"n3", "n4", "n5"},
			[2]string{"n3", "n4"}, [2]string{"n3", "n5"}, [2]string{"n4", "n3"}, [2]string{"n4", "n5"}, [2]string{"n5", "n3"}, [2]string{"n5", "n4"})},
		// n2 out and {n1,n3} cut from {n4,n5}: fencing n5, then n4,
		// leaves two of five, and n5 alone fenced leaves the cut
		// standing; n2, back beside n4 and n5, completes the fences of
		// n1 and n3 instead.
		{name: "split, one node out", m: m([]string{"n1", "n3", "n4", "n5"},
			[2]string{"n1", "n4"}, [2]string{"n1", "n5"}, [2]string{"n3", "n4"}, [2]string{"n3", "n5"},
			[2]string{"n4", "n1"}, [2]string{"n4", "n3"}, [2]string{"n5", "n1"}, [2]string{"n5", "n3"})},
		// The same split, its reports still coming in: n4 reports n1
		// and n3, n1 reports n4. Fencing n4 ends the cut with three of
		// five registered.
		{name: "split, one node out, reports coming in", m: m([]string{"n1", "n3", "n4", "n5"},
			[2]string{"n1", "n4"}, [2]string{"n3", "n4"}, [2]string{"n4", "n1"}), want: "n4", reporters: []string{"n1"}},
		// n2 out, and a single link cut between n3 and n4: three stay.
		{name: "single link, one node out", m: m([]string{"n1", "n3", "n4", "n5"}, [2]string{"n3", "n4"}, [2]string{"n4", "n3"}), want: "n4", reporters: []string{"n3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ok := CutDue(tc.m)
			if tc.want == "" {
				if ok {
					t.Fatalf("CutDue = %+v, want none", d)
				}
				return
			}
			if !ok || d.Node != tc.want || !slices.Equal(d.Reporters, tc.reporters) {
				t.Fatalf("CutDue = %+v, %v; want %s reported by %v", d, ok, tc.want, tc.reporters)
			}
		})
	}
}

// TestFenceNode: a fence removes the suspect's record and writes its
// fence in one transaction, which the membership follows; a fence whose
// reporter's record is gone (the fencer's own included) writes nothing,
// so two nodes that lost each other do not fence each other; a fence on a record another registration
// replaced writes nothing; the fenced process clears its fence only as
// it stands.
func TestFenceNode(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 30*time.Second)
	n1, err := Register(ctx, cli, "n1", NodeOptions{Address: "a:1", Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close(ctx)
	// n2 may not register again while fenced: its gate says so.
	gate := errors.New("fenced: no feed yet")
	n2, err := Register(ctx, cli, "n2", NodeOptions{Address: "a:2", Log: testLog(t), MayRegister: func(ctx context.Context, _ *Term) error {
		if _, ok, err := ReadFence(ctx, cli, "n2"); err != nil || ok {
			return gate
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close(ctx)
	m, err := ListMembership(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := WatchMembership(wctx, cli, m.Rev)
	rec2 := m.Nodes["n2"]
	if err := PutReport(ctx, cli, n1.Lease(), "n1", "n2", m.Nodes["n2"].Started.UnixNano()); err != nil {
		t.Fatal(err)
	}
	if err := PutReport(ctx, cli, n2.Lease(), "n2", "n1", m.Nodes["n1"].Started.UnixNano()); err != nil {
		t.Fatal(err)
	}
	rec1 := m.Nodes["n1"]
	ok, err := FenceNode(ctx, cli, "n1", m.Nodes["n2"], []NodeRecord{rec1})
	if err != nil || !ok {
		t.Fatalf("n1 fencing n2: %v, %v", ok, err)
	}
	// n2 lost its record: its fence of n1 must not pass.
	if ok, err := FenceNode(ctx, cli, "n2", rec1, []NodeRecord{rec2}); err != nil || ok {
		t.Fatalf("n2, fenced, fencing n1: %v, %v (want refused)", ok, err)
	}
	// The watch brings the record's removal and the fence.
	for _, alive := m.Nodes["n2"]; !m.Fenced("n2", rec2.Started.UnixNano()) || alive; _, alive = m.Nodes["n2"] {
		select {
		case resp := <-wch:
			for _, ev := range resp.Events {
				if _, _, err := m.Apply(ev); err != nil {
					t.Fatal(err)
				}
			}
		case <-ctx.Done():
			t.Fatalf("the watch did not bring the fence: %+v", m)
		}
	}
	if _, err := FenceNode(ctx, cli, "n1", NodeRecord{}, []NodeRecord{rec1}); err == nil {
		t.Fatal("a fence of no record passed")
	}
	if _, err := FenceNode(ctx, cli, "n2", rec1, []NodeRecord{rec1}); err == nil {
		t.Fatal("a fence whose fencer is not among the reporters passed")
	}
	f := m.Fences["n2"]
	if f.By != "n1" || m.Fenced("n2", f.Inc+1) {
		t.Fatalf("fence %+v: a newer process of n2 would be fenced too, or the fencer is not named", f)
	}
	// Its term ended; the gate holds its registration off.
	fencedTerm := n2.Term()
	<-fencedTerm.Done()
	time.Sleep(time.Second)
	if n2.Registered() {
		t.Fatal("n2 registered again while fenced")
	}
	// A fence of the same registration again writes nothing.
	if ok, err := FenceNode(ctx, cli, "n1", rec2, []NodeRecord{rec1}); err != nil || ok {
		t.Fatalf("fencing a record already removed: %v, %v", ok, err)
	}
	stale := f
	stale.Rev--
	if err := ClearFence(ctx, cli, stale); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ReadFence(ctx, cli, "n2"); err != nil || !ok {
		t.Fatalf("a clear of another fence removed it: %v, %v", ok, err)
	}
	if err := ClearFence(ctx, cli, f); err != nil {
		t.Fatal(err)
	}
	nctx, ncancel := context.WithTimeout(ctx, 10*time.Second)
	defer ncancel()
	if _, err := n2.NextTerm(nctx, fencedTerm); err != nil {
		t.Fatalf("n2 did not register again once its fence was cleared: %v", err)
	}
}

// TestReportOnRegister: the reports a registration gate counted on go in
// the transaction that creates the record, on its lease: no revision
// shows the node registered without them, and they go with the lease.
func TestReportOnRegister(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	cli := newClient(t, e)
	ctx := testCtx(t, 30*time.Second)
	n1, err := Register(ctx, cli, "n1", NodeOptions{Address: "a:1", Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer n1.Close(ctx)
	m, err := ListMembership(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	inc := m.Nodes["n1"].Started.UnixNano()
	n2, err := Register(ctx, cli, "n2", NodeOptions{Address: "a:2", Log: testLog(t),
		ReportOnRegister: func() map[string]int64 { return map[string]int64{"n1": inc} }})
	if err != nil {
		t.Fatal(err)
	}
	m, err = ListMembership(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	rep, ok := m.Reports[ReportKey("n1", "n2")]
	if !ok || rep.Inc != inc {
		t.Fatalf("n2's report on n1 after its registration: %+v, %v", rep, ok)
	}
	// The record's creation and the report are one revision.
	resp, err := cli.Get(ctx, ReportKey("n1", "n2"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("report: %v, %d keys", err, len(resp.Kvs))
	}
	if got, want := resp.Kvs[0].CreateRevision, m.Nodes["n2"].Created; got != want {
		t.Fatalf("report created at revision %d, the record at %d", got, want)
	}
	if resp.Kvs[0].Lease == 0 || resp.Kvs[0].Lease != m.Nodes["n2"].Lease {
		t.Fatalf("report on lease %x, the record on %x", resp.Kvs[0].Lease, m.Nodes["n2"].Lease)
	}
	if err := n2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	m, err = ListMembership(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Reports[ReportKey("n1", "n2")]; ok {
		t.Fatal("n2's report outlived its registration")
	}
}
