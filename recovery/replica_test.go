package recovery

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

const testPartition = 3

func newTestReplica(t *testing.T, live bool, fence uint64) *Replica {
	t.Helper()
	r, err := NewReplica(ReplicaConfig{Partition: testPartition, Live: live, Fence: fence,
		NewExecutor: func() (*partition.Executor, error) { return newReplica(t, nil), nil }})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func destConfig(epoch uint64) DestinationConfig {
	return DestinationConfig{Header: wire.MsgHeader{Epoch: epoch, Partition: testPartition}, StallTicksMax: 50, HeartbeatTicks: 5}
}

func sourceConfig(epoch uint64) SourceConfig {
	return DefaultSourceConfig(wire.MsgHeader{Epoch: epoch, Partition: testPartition})
}

// kinds lists the kinds of outs, for comparing sequences.
func kinds(outs []Output) []OutputKind {
	var ks []OutputKind
	for _, o := range outs {
		ks = append(ks, o.Kind)
	}
	return ks
}

func sameKinds(got []Output, want ...OutputKind) bool {
	k := kinds(got)
	if len(k) != len(want) {
		return false
	}
	for i := range k {
		if k[i] != want[i] {
			return false
		}
	}
	return true
}

func testGenerator(t *testing.T, in txnid.Initiator, now *int64) *txnid.Generator {
	t.Helper()
	g, err := txnid.NewGenerator(in, func() int64 { return *now })
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func upsert(t *testing.T, id txnid.ID, key int) partition.Invocation {
	t.Helper()
	var enc wire.TupleEncoder
	params, err := enc.AppendTuple(nil, []wire.Value{wire.String("kv"), wire.Bytes(kvKey(key)), wire.Bytes([]byte("v")), wire.Int64(int64(key))})
	if err != nil {
		t.Fatal(err)
	}
	return partition.Invocation{ID: id, Proc: partition.ProcUpsert, Params: params}
}

// TestReplicaMoves: the table holds the lifecycle's moves and nothing
// else; an illegal move panics, and a legal one is made.
func TestReplicaMoves(t *testing.T) {
	legal := map[[2]ReplicaState]bool{
		{ReplicaNeedsRejoin, ReplicaRejoining}: true,
		{ReplicaRejoining, ReplicaLive}:        true,
		{ReplicaRejoining, ReplicaNeedsRejoin}: true,
		{ReplicaLive, ReplicaNeedsRejoin}:      true,
	}
	states := []ReplicaState{ReplicaNeedsRejoin, ReplicaRejoining, ReplicaLive}
	for _, from := range states {
		for _, to := range states {
			r := newTestReplica(t, false, 0)
			r.state = from
			panicked := func() (p bool) {
				defer func() { p = recover() != nil }()
				r.move(to)
				return false
			}()
			if panicked == legal[[2]ReplicaState{from, to}] {
				t.Errorf("%v → %v: panicked %v, legal %v", from, to, panicked, legal[[2]ReplicaState{from, to}])
			}
			if !panicked && r.state != to {
				t.Errorf("%v → %v: state %v after the move", from, to, r.state)
			}
			if panicked && r.state != from {
				t.Errorf("%v → %v: illegal move changed the state to %v", from, to, r.state)
			}
		}
	}
	if got := ReplicaNeedsRejoin.String() + "," + ReplicaRejoining.String() + "," + ReplicaLive.String(); got != "needs-rejoin,rejoining,live" {
		t.Fatalf("names %q", got)
	}
}

// TestReplicaStateText: the names are what etcd's placement records and
// /status have always carried, and the numbers what every data directory
// stores; any other name or number is refused, not read as a state.
func TestReplicaStateText(t *testing.T) {
	for s, want := range map[ReplicaState]struct {
		n    uint8
		json string
	}{
		ReplicaNeedsRejoin: {1, `{"state":"needs-rejoin"}`},
		ReplicaRejoining:   {2, `{"state":"rejoining"}`},
		ReplicaLive:        {3, `{"state":"live"}`},
		ReplicaHeld:        {4, `{"state":"held"}`},
	} {
		type record struct {
			State ReplicaState `json:"state"`
		}
		if uint8(s) != want.n {
			t.Errorf("%v is %d, stored as %d", s, uint8(s), want.n)
		}
		b, err := json.Marshal(record{s})
		if err != nil || string(b) != want.json {
			t.Errorf("%v: %s, %v; want %s", s, b, err, want.json)
		}
		var back record
		if err := json.Unmarshal(b, &back); err != nil || back.State != s {
			t.Errorf("%s: read back %v, %v", b, back.State, err)
		}
	}
	for _, bad := range []string{"", "Live", "live ", "done", "replica-state(3)"} {
		s := ReplicaLive
		if err := s.UnmarshalText([]byte(bad)); !errors.Is(err, ErrReplicaState) || s != ReplicaLive {
			t.Errorf("%q: %v, state %v", bad, err, s)
		}
	}
	for _, bad := range []ReplicaState{0, 5, 255} {
		if b, err := bad.MarshalText(); !errors.Is(err, ErrReplicaState) || bad.Valid() {
			t.Errorf("%d: %q, %v, valid %v", uint8(bad), b, err, bad.Valid())
		}
	}
}

// TestReplicaFence: no destination attempt at or below the fence starts,
// nor below or beside the running one; the running one resumes; the fence
// rises with every start, so an ended attempt's epoch never comes back.
func TestReplicaFence(t *testing.T) {
	r := newTestReplica(t, false, 10)
	if _, err := r.CheckDestination("n1", 11); err == nil || !strings.Contains(err.Error(), "no initiator") {
		t.Fatalf("an attempt started without an initiator heard: %v", err)
	}
	r.AddInitiator(1)
	for _, e := range []uint64{9, 10} {
		if err := r.StartDestination("n1", destConfig(e)); !errors.Is(err, ErrReplica) || !strings.Contains(err.Error(), "not above 10") {
			t.Fatalf("epoch %d at or below the fence: %v", e, err)
		}
	}
	if r.State() != ReplicaNeedsRejoin || r.Destination() != nil {
		t.Fatalf("a refused start changed the replica: %v", r.State())
	}
	if err := r.StartDestination("n1", destConfig(12)); err != nil {
		t.Fatal(err)
	}
	if r.State() != ReplicaRejoining || r.Fence() != 12 {
		t.Fatalf("state %v fence %d after starting epoch 12", r.State(), r.Fence())
	}
	if resume, err := r.CheckDestination("n1", 12); err != nil || !resume {
		t.Fatalf("the running attempt does not resume: %v %v", resume, err)
	}
	if err := r.StartDestination("n1", destConfig(12)); err == nil {
		t.Fatal("the running attempt started twice")
	}
	if _, err := r.CheckDestination("n2", 12); err == nil {
		t.Fatal("another peer resumed the attempt of epoch 12")
	}
	if _, err := r.CheckDestination("n1", 11); err == nil {
		t.Fatal("epoch 11 started during the attempt of 12")
	}
	if err := r.ResumeDestination(12); err != nil {
		t.Fatal(err)
	}
	// A newer epoch supersedes: the old attempt ends first.
	old := r.Destination()
	if err := r.StartDestination("n2", destConfig(13)); err != nil {
		t.Fatal(err)
	}
	if outs := r.Outbox(); !sameKinds(outs, OutDestinationMessages, OutDestinationEnded) || outs[1].Epoch != 12 {
		t.Fatalf("superseding: %v", kinds(outs))
	}
	if old.State() != StateAborted || r.State() != ReplicaRejoining || r.Destination() == old {
		t.Fatalf("superseded attempt %v, replica %v", old.State(), r.State())
	}
	r.AbortDestination(13, wire.AbortTimeout, "test")
	if outs := r.Outbox(); !sameKinds(outs, OutDestinationMessages, OutDestinationEnded) {
		t.Fatalf("abort: %v", kinds(outs))
	}
	if r.State() != ReplicaNeedsRejoin || r.Executing() {
		t.Fatalf("after the abort: %v, executing %v", r.State(), r.Executing())
	}
	for _, e := range []uint64{12, 13} {
		if _, err := r.CheckDestination("n1", e); err == nil {
			t.Fatalf("epoch %d started again after it ended", e)
		}
	}
	if err := r.ResumeDestination(13); err == nil {
		t.Fatal("an ended attempt resumed")
	}
	live := newTestReplica(t, true, 0)
	live.AddInitiator(1)
	if _, err := live.CheckDestination("n1", 1); err == nil {
		t.Fatal("a destination attempt started on a live replica")
	}
}

// TestReplicaRefusedTxnFailsLive: a live replica that cannot take in a
// txn of its feed is no copy any more: it fails, drops its executor and
// its feed, and says why.
func TestReplicaRefusedTxnFailsLive(t *testing.T) {
	now := txnid.EpochUnixMillis + 5000
	g := testGenerator(t, 1, &now)
	r := newTestReplica(t, true, 0)
	r.AddInitiator(1)
	first, second := g.Next(), g.Next()
	if !r.OnTxn(upsert(t, second, 1)) || !r.OnHeartbeat(g.Next()) {
		t.Fatal("a live replica refused its feed")
	}
	if n := r.Step(10); n != 1 {
		t.Fatalf("ran %d txns, want 1", n)
	}
	res := r.Results()
	if len(res) != 1 || res[0].ID != second || res[0].Partition != testPartition || res[0].Err != "" {
		t.Fatalf("results %+v", res)
	}
	if r.Results() != nil {
		t.Fatal("results given twice")
	}
	// first is below what ran: it can no longer run in order.
	if r.OnTxn(upsert(t, first, 2)) {
		t.Fatal("a txn below the last executed was taken in")
	}
	outs := r.Outbox()
	if !sameKinds(outs, OutFailed) || !strings.Contains(outs[0].Why, "refused") {
		t.Fatalf("outbox %+v", outs)
	}
	if r.State() != ReplicaNeedsRejoin || r.Executor() != nil || r.Executing() {
		t.Fatalf("after the refusal: %v", r.State())
	}
	if r.OnTxn(upsert(t, g.Next(), 3)) || r.OnHeartbeat(g.Next()) || r.Step(10) != 0 {
		t.Fatal("a failed replica took in its feed")
	}
	r.Fail("again")
	if len(r.Outbox()) != 0 {
		t.Fatal("a replica failed twice")
	}
}

// TestReplicaRefusedTxnEndsAttempt: while rejoining, a refused txn ends
// the attempt, not the replica's lifecycle with a failure: the attempt
// would build a copy with a hole.
func TestReplicaRefusedTxnEndsAttempt(t *testing.T) {
	now := txnid.EpochUnixMillis + 5000
	g := testGenerator(t, 1, &now)
	r := newTestReplica(t, false, 0)
	r.AddInitiator(1)
	cfg := destConfig(1)
	cfg.BufferBytesMax = 200
	if err := r.StartDestination("n1", cfg); err != nil {
		t.Fatal(err)
	}
	for r.State() == ReplicaRejoining {
		r.OnTxn(upsert(t, g.Next(), 1))
	}
	outs := r.Outbox()
	last := outs[len(outs)-1]
	if last.Kind != OutDestinationEnded || !strings.Contains(last.Err.Error(), "buffer full") {
		t.Fatalf("outbox %v, last %+v", kinds(outs), last)
	}
	for _, o := range outs {
		if o.Kind == OutFailed {
			t.Fatal("a refused txn while rejoining failed the replica")
		}
	}
	if r.State() != ReplicaNeedsRejoin || r.Destination() != nil {
		t.Fatalf("after the refusal: %v", r.State())
	}
}

// TestReplicaRejoin runs a whole rejoin between two cores, the only driver
// being this test: the feed goes to both, the destination attempt buffers
// it (no executor, no result) until it is live, the outboxes carry the
// messages, and both end as the protocol says.
func TestReplicaRejoin(t *testing.T) {
	now := txnid.EpochUnixMillis + 5000
	gens := []*txnid.Generator{testGenerator(t, 1, &now), testGenerator(t, 2, &now)}
	src := newTestReplica(t, true, 0)
	dst := newTestReplica(t, false, 0)
	for _, r := range []*Replica{src, dst} {
		r.AddInitiator(1)
		r.AddInitiator(2)
	}
	key := 0
	feed := func(both bool) {
		for _, g := range gens {
			now++
			inv := upsert(t, g.Next(), key%50)
			key++
			if !src.OnTxn(inv) || (both && !dst.OnTxn(inv)) {
				t.Fatalf("txn %v refused", inv.ID)
			}
		}
	}
	for range 40 {
		feed(false)
		src.Step(100)
	}
	src.Results()
	if err := src.StartSource("n2", sourceConfig(5)); err != nil {
		t.Fatal(err)
	}
	if err := src.StartSource("n3", sourceConfig(6)); err == nil {
		t.Fatal("another peer's source attempt took the running one's place")
	}
	if err := dst.StartSource("n1", sourceConfig(1)); err == nil {
		t.Fatal("a source attempt started on a replica that needs a rejoin")
	}
	if err := dst.StartDestination("n1", destConfig(5)); err != nil {
		t.Fatal(err)
	}
	// Rejoining, the feed goes to the attempt, which buffers it.
	feed(true)
	if m := dst.Destination().Metrics(); m.BufferBytesPeak == 0 || !dst.Executing() || dst.JoinFloor() != txnid.Zero {
		t.Fatalf("the attempt did not take the feed: buffer peak %d", m.BufferBytesPeak)
	}
	var toSrc, toDst []wire.Message
	var srcEnded, dstLive *Output
	take := func() {
		for _, o := range src.Outbox() {
			switch o.Kind {
			case OutSourceMessages:
				toDst = append(toDst, o.Msgs...)
			case OutSourceEnded:
				srcEnded = &o
			default:
				t.Fatalf("source replica: %+v", o)
			}
		}
		for _, o := range dst.Outbox() {
			switch o.Kind {
			case OutDestinationMessages:
				toSrc = append(toSrc, o.Msgs...)
			case OutLive:
				dstLive = &o
			default:
				t.Fatalf("destination replica: %+v", o)
			}
		}
	}
	for i := 0; srcEnded == nil; i++ {
		if i > 10000 {
			t.Fatalf("no end: source %v, destination %v", src.Source().State(), dst.Destination().State())
		}
		if dstLive == nil {
			feed(true)
			if dst.Executor() != nil || dst.Step(100) != 0 || dst.Results() != nil {
				t.Fatal("the destination executed before it went live")
			}
		}
		src.Step(100)
		src.Results()
		if i%10 == 0 {
			src.Tick()
			dst.Tick()
		}
		take()
		for _, m := range toDst {
			_ = dst.OnDestinationMessage(5, m)
		}
		for _, m := range toSrc {
			_ = src.OnSourceMessage(5, m)
		}
		toSrc, toDst = nil, nil
		take()
	}
	if srcEnded.Err != nil || srcEnded.Epoch != 5 || src.Source() != nil || src.State() != ReplicaLive {
		t.Fatalf("source ended %+v, replica %v", srcEnded, src.State())
	}
	if dstLive == nil || dstLive.Epoch != 5 || dst.State() != ReplicaLive || dst.Executor() == nil {
		t.Fatalf("destination %v, live output %v", dst.State(), dstLive)
	}
	// Live: the feed runs on the destination's executor, through its
	// attempt (late txns below E are heartbeats there), and both agree.
	feed(true)
	for _, g := range gens {
		id := g.Next()
		src.OnHeartbeat(id)
		dst.OnHeartbeat(id)
	}
	src.Step(1000)
	if dst.Step(1000) == 0 || len(dst.Results()) == 0 {
		t.Fatal("the live destination ran nothing")
	}
	if a, b := src.Executor().Partition().Digest(), dst.Executor().Partition().Digest(); a != b {
		t.Fatalf("digests %016x and %016x", a, b)
	}
	if err := dst.ResumeDestination(5); err == nil {
		t.Fatal("a live attempt resumed")
	}
	dst.AbortDestination(5, wire.AbortShutdown, "too late")
	if dst.State() != ReplicaLive || len(dst.Outbox()) != 0 {
		t.Fatal("a live attempt was aborted")
	}
}

// TestReplicaRun: a driver's turn runs at most StepBurst txns; with no
// source attempt in one go, with one a txn a call through the driver's
// wrapper, stopping at the first error it returns.
func TestReplicaRun(t *testing.T) {
	now := txnid.EpochUnixMillis + 5000
	g := testGenerator(t, 1, &now)
	r := newTestReplica(t, true, 0)
	r.AddInitiator(1)
	feed := func(n int) {
		for i := range n {
			now++
			if !r.OnTxn(upsert(t, g.Next(), i%50)) {
				t.Fatal("txn refused")
			}
		}
		now++
		r.OnHeartbeat(g.Next())
	}
	calls := 0
	each := func(step func() int) error { calls++; step(); return nil }

	feed(StepBurst + 10)
	if ran, more, err := r.Run(each); ran != StepBurst || !more || err != nil || calls != 0 {
		t.Fatalf("no source: ran %d, more %v, err %v, wrapper called %d times", ran, more, err, calls)
	}
	if ran, _, _ := r.Run(each); ran != 10 {
		t.Fatalf("the rest: ran %d, want 10", ran)
	}
	if ran, more, _ := r.Run(each); ran != 0 || more {
		t.Fatalf("nothing ready: ran %d, more %v", ran, more)
	}

	if err := r.StartSource("n2", sourceConfig(5)); err != nil {
		t.Fatal(err)
	}
	feed(StepBurst + 10)
	if ran, more, err := r.Run(each); ran != StepBurst || !more || err != nil || calls != StepBurst {
		t.Fatalf("source: ran %d, more %v, err %v, wrapper called %d times", ran, more, err, calls)
	}
	stop := errors.New("link full")
	calls = 0
	failAt3 := func(step func() int) error {
		calls++
		step()
		if calls == 3 {
			return stop
		}
		return nil
	}
	if ran, _, err := r.Run(failAt3); ran != 3 || !errors.Is(err, stop) {
		t.Fatalf("wrapper's error: ran %d, want 3 (the third txn ran, then its call failed), err %v", ran, err)
	}
}

// TestReplicaFailEndsSource: a live replica serving a source fails: the
// source attempt aborts and ends first, then the failure is reported.
func TestReplicaFailEndsSource(t *testing.T) {
	r := newTestReplica(t, true, 0)
	r.AddInitiator(1)
	if err := r.StartSource("n2", sourceConfig(3)); err != nil {
		t.Fatal(err)
	}
	// A newer epoch of the same peer supersedes; an older one does not.
	if err := r.StartSource("n2", sourceConfig(4)); err != nil {
		t.Fatal(err)
	}
	if outs := r.Outbox(); !sameKinds(outs, OutSourceMessages, OutSourceEnded) || outs[1].Epoch != 3 || outs[1].Err == nil {
		t.Fatalf("superseding: %v", kinds(outs))
	}
	if err := r.StartSource("n2", sourceConfig(4)); err == nil {
		t.Fatal("the running epoch started twice")
	}
	if err := r.OnSourceMessage(3, &wire.Heartbeat{MsgHeader: wire.MsgHeader{Epoch: 3, Partition: testPartition}}); !errors.Is(err, ErrReplica) {
		t.Fatalf("a message for the ended attempt: %v", err)
	}
	r.Fail("test")
	outs := r.Outbox()
	if !sameKinds(outs, OutSourceMessages, OutSourceEnded, OutFailed) || outs[1].Epoch != 4 {
		t.Fatalf("fail: %v", kinds(outs))
	}
	var ae *AbortError
	if !errors.As(outs[1].Err, &ae) || ae.Reason != wire.AbortShutdown || !strings.Contains(ae.Text, "test") {
		t.Fatalf("source ended with %v", outs[1].Err)
	}
	if r.Source() != nil || r.State() != ReplicaNeedsRejoin {
		t.Fatalf("after the failure: %v", r.State())
	}
}

// TestReplicaDropResults: a driver that replies to no initiator gets no
// Done, and the txns run all the same.
func TestReplicaDropResults(t *testing.T) {
	now := txnid.EpochUnixMillis + 5000
	g := testGenerator(t, 1, &now)
	r, err := NewReplica(ReplicaConfig{Partition: testPartition, Live: true, DropResults: true,
		NewExecutor: func() (*partition.Executor, error) { return newReplica(t, nil), nil }})
	if err != nil {
		t.Fatal(err)
	}
	r.AddInitiator(1)
	id := g.Next()
	r.OnTxn(upsert(t, id, 1))
	r.OnHeartbeat(g.Next())
	if n := r.Step(10); n != 1 || r.Results() != nil || r.Executor().LastExecuted() != id {
		t.Fatalf("ran %d, last %v", n, r.Executor().LastExecuted())
	}
	if _, err := NewReplica(ReplicaConfig{Partition: testPartition}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no NewExecutor: %v", err)
	}
}

// TestReplicaJoinerStartsAtFloor: an initiator whose feed opens on a
// live replica sends nothing at or below the floor the replica gives it:
// what it executed or read as safe (a heartbeat of another initiator
// above its last txn), on which a source may have set its boundary. So
// the replica's safe point does not fall back for it, and a txn of it
// between the replica's last txn and that safe point is refused (sim
// seeds 369240632 and others failed on a floor of Zero, 728888924 on a
// floor of the last txn executed).
func TestReplicaJoinerStartsAtFloor(t *testing.T) {
	r := newTestReplica(t, true, 0)
	r.AddInitiator(1)
	if !r.OnTxn(upsert(t, txnid.Make(100, 0, 1), 1)) || !r.OnHeartbeat(txnid.Make(200, 0, 1)) {
		t.Fatal("txn or heartbeat refused")
	}
	r.Step(10)
	if last := r.Executor().LastExecuted(); last != txnid.Make(100, 0, 1) {
		t.Fatalf("executed up to %v, want t100.c0.i1", last)
	}
	floor := r.JoinFloor()
	if floor != txnid.Make(200, 0, 1) {
		t.Fatalf("floor %v, want the safe point read, t200.c0.i1", floor)
	}
	r.AddInitiator(2)
	if safe, ok := r.Executor().Safe(); !ok || safe < floor {
		t.Fatalf("after a joiner, safe point %v (%v), want at least the floor %v", safe, ok, floor)
	}
	if r.OnTxn(upsert(t, txnid.Make(150, 0, 2), 2)) {
		t.Fatal("the joiner's txn below its floor, above the last txn executed, was taken")
	}
}

// TestReplicaHeartbeatBelowJoinFloor: a live replica that starts tracking
// an initiator at its safe point (a join) may then read that initiator's
// heartbeat sent before it learned the floor, below it. The heartbeat
// says nothing new and is passed over; the replica stays live. Refused,
// it failed the replica.
func TestReplicaHeartbeatBelowJoinFloor(t *testing.T) {
	now := txnid.EpochUnixMillis + 5000
	g1 := testGenerator(t, 1, &now)
	r := newTestReplica(t, true, 0)
	r.AddInitiator(3)
	early := g1.Next() // initiator 1's clock, before the floor below
	g3 := testGenerator(t, 3, &now)
	now += 10
	if !r.OnHeartbeat(g3.Next()) {
		t.Fatal("heartbeat of the tracked initiator refused")
	}
	r.Executor().Safe() // a read of the safe point, as a step with txns queued does
	r.AddInitiator(1)   // tracked from the safe point, above early
	if r.OnHeartbeat(early) {
		t.Fatal("a heartbeat below the join floor was taken in")
	}
	if r.State() != ReplicaLive {
		t.Fatalf("replica %v after a heartbeat below the join floor, want live", r.State())
	}
	now += 10
	if !r.OnHeartbeat(g1.Next()) || r.State() != ReplicaLive {
		t.Fatalf("a later heartbeat: state %v", r.State())
	}
}
