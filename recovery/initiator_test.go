package recovery

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// fakeIO records what an Initiator asks of its driver.
type fakeIO struct {
	sent   map[string][]wire.Message
	dials  []string // "node inc missed"
	closes []string
	// refuse makes Send to a node fail, as a full or broken feed.
	refuse map[string]bool
}

func newFakeIO() *fakeIO {
	return &fakeIO{sent: map[string][]wire.Message{}, refuse: map[string]bool{}}
}

func (f *fakeIO) Send(node string, m wire.Message) bool {
	if f.refuse[node] {
		return false
	}
	f.sent[node] = append(f.sent[node], m)
	return true
}

func (f *fakeIO) Dial(node string, d DialAsk) {
	if d.Resume {
		f.dials = append(f.dials, fmt.Sprintf("%s %d %v resume above %v", node, d.Inc, d.Missed, d.Kept))
		return
	}
	f.dials = append(f.dials, fmt.Sprintf("%s %d %v", node, d.Inc, d.Missed))
}

func (f *fakeIO) Close(node string) { f.closes = append(f.closes, node) }

// take returns and forgets what was sent to node.
func (f *fakeIO) take(node string) []wire.Message {
	ms := f.sent[node]
	delete(f.sent, node)
	return ms
}

// testInitiator is an Initiator on a clock the test moves, with a view of
// nodes n1..n3 alive (incarnation 1) holding partition 0's replicas, live.
type testInitiator struct {
	*Initiator
	io    *fakeIO
	now   int64
	view  *InitiatorView
	reply []*wire.Reply
}

func newTestInitiator(t *testing.T, beatTicks int) *testInitiator {
	t.Helper()
	ti := &testInitiator{io: newFakeIO(), now: txnid.EpochUnixMillis + 1_000_000_000}
	ti.view = &InitiatorView{Nodes: map[string]int64{"n1": 1, "n2": 1, "n3": 1},
		Placement: map[uint32][]ReplicaPlace{0: {{Node: "n1", Live: true}, {Node: "n2", Live: true}, {Node: "n3", Live: true}}, 1: {{Node: "n1", Live: true}}}, Bootstrapped: true}
	in, err := NewInitiator(InitiatorConfig{Node: "n9", ID: 9, Clock: func() int64 { return ti.now }, Partitions: 2, BeatTicks: beatTicks}, ti.io)
	if err != nil {
		t.Fatal(err)
	}
	ti.Initiator = in
	return ti
}

// openAll opens a feed to every node of the view, each with floor 0, and
// ticks once: each opened feed starts with a heartbeat.
func (ti *testInitiator) openAll(t *testing.T) {
	t.Helper()
	ti.SetView(ti.view)
	for _, n := range sortedKeys(ti.view.Nodes) {
		ti.FeedOpened(n, txnid.Zero)
	}
	ti.Tick()
	for _, n := range sortedKeys(ti.view.Nodes) {
		if ms := ti.io.take(n); len(ms) != 1 || ms[0].Type() != wire.MsgBeat {
			t.Fatalf("feed to %s opened with %v, want one heartbeat", n, ms)
		}
	}
}

func (ti *testInitiator) submit(t *testing.T, p uint32, each bool) error {
	t.Helper()
	return ti.Submit(ti.view, true, &wire.Call{Req: 7, Partition: p, Proc: "upsert", Each: each}, func(r *wire.Reply) { ti.reply = append(ti.reply, r) })
}

// lastTxn returns the txn last sent to node.
func lastTxn(t *testing.T, io *fakeIO, node string) *wire.Txn {
	t.Helper()
	ms := io.sent[node]
	if len(ms) == 0 {
		t.Fatalf("nothing sent to %s", node)
	}
	txn, ok := ms[len(ms)-1].(*wire.Txn)
	if !ok {
		t.Fatalf("last sent to %s: %v, not a txn", node, ms[len(ms)-1])
	}
	return txn
}

// TestInitiatorWaitsForEveryLiveReplica: a call is answered only once
// every live replica it was sent to answered; a replica that is not live
// (rejoining) gets the txn but is not waited for; the first answer is
// the reply, and Each has every waited replica's.
func TestInitiatorWaitsForEveryLiveReplica(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.view.Placement[0][2].Live = false
	ti.openAll(t)
	if err := ti.submit(t, 0, true); err != nil {
		t.Fatal(err)
	}
	id := lastTxn(t, ti.io, "n1").ID
	for _, n := range []string{"n2", "n3"} {
		if got := lastTxn(t, ti.io, n).ID; got != id {
			t.Fatalf("%s got txn %v, n1 %v", n, got, id)
		}
	}
	ti.OnDone("n1", &wire.Done{ID: id, Out: []byte("a")})
	ti.OnDone("n3", &wire.Done{ID: id, Out: []byte("c")})
	if len(ti.reply) != 0 {
		t.Fatalf("answered while n2 is waited for: %+v", ti.reply[0])
	}
	ti.OnDone("n2", &wire.Done{ID: id, Out: []byte("b")})
	ti.OnDone("n2", &wire.Done{ID: id, Out: []byte("b")}) // a late duplicate
	if len(ti.reply) != 1 {
		t.Fatalf("%d replies, want 1", len(ti.reply))
	}
	r := ti.reply[0]
	if r.Req != 7 || r.ID != id || string(r.Out) != "a" || r.Err != "" || len(r.Each) != 2 || r.Each[1].Node != "n2" {
		t.Fatalf("reply %+v", r)
	}
	if ti.Pending() != 0 {
		t.Fatal("call still pending")
	}
}

// TestInitiatorAnswersThatDiffer: replicas that answer one txn
// differently ran different histories before it (one ran a txn the
// other never got, which the cluster may not keep), so the call's
// outcome is unknown, not the first answer; equal answers are the
// reply; a call with Each gets every answer, for its caller to compare.
// The first answer alone once returned an uncertain write only a
// cut-off replica had run, and the next read, through the replica that
// ran on without it, the value before (rejoin chaos --seed 406596625).
func TestInitiatorAnswersThatDiffer(t *testing.T) {
	for _, tt := range []struct {
		name          string
		each          bool
		n2            string
		wantUncertain bool
	}{
		{name: "equal", n2: "a"},
		{name: "different", n2: "b", wantUncertain: true},
		{name: "different, each", each: true, n2: "b"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ti := newTestInitiator(t, 1)
			ti.view.Placement[0] = ti.view.Placement[0][:2]
			ti.openAll(t)
			if err := ti.submit(t, 0, tt.each); err != nil {
				t.Fatal(err)
			}
			id := ti.gen.Last()
			ti.OnDone("n1", &wire.Done{ID: id, Out: []byte("a")})
			ti.OnDone("n2", &wire.Done{ID: id, Out: []byte(tt.n2)})
			if len(ti.reply) != 1 {
				t.Fatalf("%d replies, want 1", len(ti.reply))
			}
			r := ti.reply[0]
			if r.Uncertain != tt.wantUncertain {
				t.Fatalf("reply %+v, want uncertain %v", r, tt.wantUncertain)
			}
			if tt.wantUncertain {
				if r.Out != nil || !strings.Contains(r.Err, "answered differently") {
					t.Fatalf("uncertain reply %+v", r)
				}
				return
			}
			if string(r.Out) != "a" || r.Err != "" || (tt.each && len(r.Each) != 2) {
				t.Fatalf("reply %+v", r)
			}
		})
	}
}

// TestInitiatorReplyWhenReplicasLost: a call's reply once nothing is
// waited for. A txn that went out and lost every replica it waited for is
// uncertain (it may have run on one of them); one sent nowhere is a plain
// failure; a replica's result is the answer. A node is lost by the view
// taking it for dead or by its replica no longer live there, or live
// again since the call was sequenced (another Rev). A feed that
// only breaks loses nothing: the call waits for the node until one of
// those (or a feed not taken up again: TestInitiatorFeedLogBound).
func TestInitiatorReplyWhenReplicasLost(t *testing.T) {
	losses := map[string]func(ti *testInitiator, node string){
		"node dead": func(ti *testInitiator, node string) {
			delete(ti.view.Nodes, node)
			ti.SetView(ti.view)
		},
		"replica not live": func(ti *testInitiator, node string) {
			for i := range ti.view.Placement[0] {
				if ti.view.Placement[0][i].Node == node {
					ti.view.Placement[0][i].Live = false
				}
			}
			ti.SetView(ti.view)
		},
		// Failed and rebuilt between two views: live in both, its
		// record written since (TestFencedNodeBackMidRepair's writer
		// stuck in a call for good).
		"replica live again": func(ti *testInitiator, node string) {
			for i := range ti.view.Placement[0] {
				if ti.view.Placement[0][i].Node == node {
					ti.view.Placement[0][i].Rev++
				}
			}
			ti.SetView(ti.view)
		},
	}
	tests := []struct {
		name          string
		refused       bool // every send is skipped: lost on the way
		answer        bool // n1 answers before the others are lost
		wantUncertain bool
		wantErr       string
	}{
		{name: "sent, every replica lost", wantUncertain: true, wantErr: "outcome is unknown"},
		{name: "never sent", refused: true, wantErr: "reached no live replica"},
		{name: "one answered, the others lost", answer: true},
	}
	for lname, lose := range losses {
		for _, tt := range tests {
			t.Run(lname+"/"+tt.name, func(t *testing.T) {
				ti := newTestInitiator(t, 1)
				ti.openAll(t)
				if tt.refused {
					ti.cfg.Knobs.SkipSend = func(string, txnid.ID) bool { return true }
				}
				if err := ti.submit(t, 0, false); err != nil {
					t.Fatal(err)
				}
				id := ti.gen.Last()
				if !tt.refused {
					if tt.answer {
						ti.OnDone("n1", &wire.Done{ID: id})
					} else {
						lose(ti, "n1")
					}
					ti.FeedLost("n2")
					if len(ti.reply) != 0 {
						t.Fatalf("answered once n2's feed broke: %+v", ti.reply[0])
					}
					lose(ti, "n2")
					if len(ti.reply) != 0 {
						t.Fatalf("answered while n3 is waited for: %+v", ti.reply[0])
					}
					lose(ti, "n3")
				}
				if len(ti.reply) != 1 {
					t.Fatalf("%d replies, want 1", len(ti.reply))
				}
				r := ti.reply[0]
				if r.Uncertain != tt.wantUncertain || !strings.Contains(r.Err, tt.wantErr) || (tt.wantErr == "") != (r.Err == "") || r.Req != 7 || r.ID != id {
					t.Fatalf("reply %+v; want uncertain %v, error %q", r, tt.wantUncertain, tt.wantErr)
				}
				if ti.Pending() != 0 {
					t.Fatal("call still pending")
				}
			})
		}
	}
}

// TestInitiatorRefuses: what a call is refused for, with nothing sent.
func TestInitiatorRefuses(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.openAll(t)
	call := func(p uint32) *wire.Call { return &wire.Call{Req: 1, Partition: p} }
	never := func(r *wire.Reply) { t.Fatalf("refused call answered: %+v", r) }
	if err := ti.Submit(ti.view, false, call(0), never); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Fatalf("unregistered: %v", err)
	}
	if err := ti.Submit(ti.view, true, call(2), never); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("partition 2 of 2: %v", err)
	}
	ti.view.Bootstrapped = false
	if err := ti.Submit(ti.view, true, call(0), never); err == nil || !strings.Contains(err.Error(), "not bootstrapped") {
		t.Fatalf("not bootstrapped: %v", err)
	}
	ti.view.Bootstrapped = true
	ti.view.Placement[1][0].Live = false
	if err := ti.Submit(ti.view, true, call(1), never); !errors.Is(err, ErrNoLiveReplica) {
		t.Fatalf("no live replica: %v", err)
	}
	if len(ti.io.sent) != 0 || ti.Pending() != 0 {
		t.Fatalf("a refused call sent %v, %d pending", ti.io.sent, ti.Pending())
	}
}

// TestInitiatorFeedFloor: a feed asked for carries nothing before its
// floor, a txn of a partition with a replica there is refused meanwhile
// (its node is unfed), and once the floor is in the feed starts with a
// heartbeat above it and every ID issued after lies above it, though the
// initiator's clock runs far behind (docs/DESIGN.md "An initiator that
// joins").
func TestInitiatorFeedFloor(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.view.Nodes = map[string]int64{"n1": 4}
	ti.view.Placement[0] = ti.view.Placement[0][:1]
	ti.SetView(ti.view)
	if !slices.Equal(ti.io.dials, []string{"n1 4 []"}) {
		t.Fatalf("dials %v", ti.io.dials)
	}
	ti.SetView(ti.view)
	if len(ti.io.dials) != 1 {
		t.Fatalf("a second dial while the first is under way: %v", ti.io.dials)
	}
	var unfed *UnfedError
	if err := ti.submit(t, 0, false); !errors.As(err, &unfed) || !slices.Equal(unfed.Nodes, []string{"n1"}) {
		t.Fatalf("call before the floor: %v", err)
	}
	for range 3 {
		ti.Tick()
	}
	if len(ti.io.sent) != 0 {
		t.Fatalf("sent before the floor: %v", ti.io.sent)
	}
	floor := txnid.Make(ti.now-txnid.EpochUnixMillis+60_000, 5, 2) // a minute ahead of this clock
	if first := ti.gen.Next(); first >= floor {
		t.Fatalf("the clock is not behind: %v >= %v", first, floor)
	}
	ti.FeedOpened("n1", floor)
	ti.Tick()
	ms := ti.io.take("n1")
	if len(ms) != 1 || ms[0].(*wire.Beat).ID <= floor {
		t.Fatalf("feed opened with %v, want a heartbeat above %v", ms, floor)
	}
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	if id := lastTxn(t, ti.io, "n1").ID; id <= floor {
		t.Fatalf("txn %v at or below the floor %v", id, floor)
	}
	ti.io.take("n1")
	ti.Tick() // the tick of the txn
	ti.Tick()
	if ms := ti.io.take("n1"); len(ms) != 1 || ms[0].(*wire.Beat).ID <= floor {
		t.Fatalf("heartbeat %v not above the floor %v", ms, floor)
	}
}

// TestInitiatorDialFailed: a failed dial leaves the node unfed, and the
// next view asks again.
func TestInitiatorDialFailed(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.SetView(ti.view)
	ti.DialFailed("n2")
	ti.SetView(ti.view)
	if want := []string{"n1 1 []", "n2 1 []", "n3 1 []", "n2 1 []"}; !slices.Equal(ti.io.dials, want) {
		t.Fatalf("dials %v, want %v", ti.io.dials, want)
	}
}

// TestInitiatorHeartbeat: a heartbeat goes out on every open feed after
// BeatTicks ticks in a row with nothing sent, and a txn sent puts it off.
func TestInitiatorHeartbeat(t *testing.T) {
	ti := newTestInitiator(t, 3)
	ti.Tick()
	ti.Tick()
	ti.Tick()     // no feed open: nothing to beat on
	ti.openAll(t) // a tick, the feeds' first heartbeat
	beats := func() int {
		n := 0
		for _, node := range []string{"n1", "n2", "n3"} {
			for _, m := range ti.io.take(node) {
				if m.Type() == wire.MsgBeat {
					n++
				}
			}
		}
		return n
	}
	ti.Tick()
	ti.Tick()
	if got := beats(); got != 0 {
		t.Fatalf("%d heartbeats after 2 idle ticks of 3", got)
	}
	ti.Tick()
	if got := beats(); got != 3 {
		t.Fatalf("%d heartbeats after 3 idle ticks, want one per feed", got)
	}
	if err := ti.submit(t, 1, false); err != nil {
		t.Fatal(err)
	}
	ti.io.take("n1")
	ti.Tick() // a txn went out in this one
	ti.Tick()
	ti.Tick()
	if got := beats(); got != 0 {
		t.Fatalf("%d heartbeats 2 idle ticks after a txn", got)
	}
	ti.Tick()
	if got := beats(); got != 3 {
		t.Fatalf("%d heartbeats after 3 idle ticks, want 3", got)
	}
	// A feed that opens gets a heartbeat at the next tick, though a txn
	// went out elsewhere in it and none is due on the others.
	ti.FeedLost("n3")
	ti.SetView(ti.view)
	ti.FeedOpened("n3", txnid.Zero)
	if err := ti.submit(t, 1, false); err != nil {
		t.Fatal(err)
	}
	ti.io.take("n1")
	ti.Tick()
	if ms := ti.io.take("n3"); len(ms) != 1 || ms[0].Type() != wire.MsgBeat || beats() != 0 {
		t.Fatalf("a fresh feed got %v at the next tick; want one heartbeat, and none elsewhere", ms)
	}
	ti.Tick()
	if got := beats(); got != 0 {
		t.Fatalf("%d heartbeats after a fresh feed's first", got)
	}
}

// TestInitiatorBeatPast: asked to pass another initiator's ID, an
// initiator sends one heartbeat above it on every open feed at once, its
// clock far behind that ID notwithstanding; an ID at or below a heartbeat
// a feed had sends nothing there (a feed opened since gets one), one more
// than BeatPastAheadMillisMax ahead of its clock nothing at all, and its
// own IDs go on above the heartbeat.
func TestInitiatorBeatPast(t *testing.T) {
	ti := newTestInitiator(t, 1000)
	ti.BeatPast(txnid.Make(5, 0, 1)) // no feed open: nothing to beat on
	ti.openAll(t)
	beatsTo := func() map[string]txnid.ID {
		got := map[string]txnid.ID{}
		for _, node := range []string{"n1", "n2", "n3"} {
			for _, m := range ti.io.take(node) {
				b, ok := m.(*wire.Beat)
				if !ok {
					t.Fatalf("%s got %v, want heartbeats only", node, m)
				}
				if _, dup := got[node]; dup {
					t.Fatalf("%s got two heartbeats", node)
				}
				got[node] = b.ID
			}
		}
		return got
	}
	// Another initiator's clock runs 2 s ahead of this one's.
	ms := ti.now - txnid.EpochUnixMillis + 2000
	asked := txnid.Make(ms, 7, 1)
	ti.BeatPast(asked)
	got := beatsTo()
	if len(got) != 3 {
		t.Fatalf("heartbeats %v, want one on each of the 3 feeds", got)
	}
	beat := got["n1"]
	for node, id := range got {
		if id != beat || id <= asked || id.Initiator() != 9 {
			t.Fatalf("%s got heartbeat %v; want one ID of initiator 9 above %v on every feed", node, id, asked)
		}
	}
	for _, id := range []txnid.ID{asked, beat - 1, beat} {
		ti.BeatPast(id)
		if got := beatsTo(); len(got) != 0 {
			t.Fatalf("asked for %v under the heartbeat %v sent: %v", id, beat, got)
		}
	}
	// A feed that opened since has not had that heartbeat: it alone gets
	// one for the same ask.
	ti.FeedLost("n3")
	ti.SetView(ti.view)
	ti.FeedOpened("n3", txnid.Zero)
	ti.BeatPast(asked)
	if got := beatsTo(); len(got) != 1 || got["n3"] <= beat {
		t.Fatalf("asked for %v again after n3's feed opened anew: %v, want one heartbeat, to n3", asked, got)
	}
	far := txnid.Make(ti.now-txnid.EpochUnixMillis+BeatPastAheadMillisMax+1, 0, 1)
	ti.BeatPast(far)
	if got := beatsTo(); len(got) != 0 {
		t.Fatalf("asked for %v, %d ms ahead of the clock: %v", far, BeatPastAheadMillisMax+1, got)
	}
	if err := ti.submit(t, 1, false); err != nil {
		t.Fatal(err)
	}
	if id := lastTxn(t, ti.io, "n1").ID; id <= beat {
		t.Fatalf("txn %v after the heartbeat %v", id, beat)
	}
	ti.io.take("n1")
	next := txnid.Make(ms+1, 0, 1)
	ti.BeatPast(next)
	if got := beatsTo(); len(got) != 3 || got["n2"] <= next {
		t.Fatalf("asked for %v: %v, want a heartbeat above it on every feed", next, got)
	}
}

// TestInitiatorBeatLead: the heartbeats of an initiator quiet for
// BeatLeadQuietTicks stand BeatLeadMillis ahead of its clock and its next
// txn above them; those of one that sequenced a txn within the quiet
// window stand at its clock; a clock the ID layout cannot hold, or a lead
// of 0, leads nowhere.
func TestInitiatorBeatLead(t *testing.T) {
	const lead, quiet = 100, 3
	newLead := func(ms int64, now *int64) *testInitiator {
		ti := newTestInitiator(t, 1)
		in, err := NewInitiator(InitiatorConfig{Node: "n9", ID: 9, Clock: func() int64 { return *now }, Partitions: 2,
			BeatTicks: 1, BeatLeadMillis: ms, BeatLeadQuietTicks: quiet}, ti.io)
		if err != nil {
			t.Fatal(err)
		}
		ti.Initiator = in
		ti.openAll(t)
		return ti
	}
	// beat ticks once and returns the heartbeat n1 got.
	beat := func(ti *testInitiator) txnid.ID {
		t.Helper()
		ti.Tick()
		ms := ti.io.take("n1")
		ti.io.take("n2")
		ti.io.take("n3")
		if len(ms) != 1 || ms[0].Type() != wire.MsgBeat {
			t.Fatalf("a tick sent %v to n1, want one heartbeat", ms)
		}
		return ms[0].(*wire.Beat).ID
	}
	now := txnid.EpochUnixMillis + 1_000_000_000
	ti := newLead(lead, &now)
	clockMs := func() int64 { return now - txnid.EpochUnixMillis }
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		ti.io.take(n)
	}
	ti.Tick() // the tick of the txn: no heartbeat
	for range quiet - 1 {
		now++
		if id := beat(ti); id.Millis() != clockMs() {
			t.Fatalf("heartbeat %v within %d ticks of a txn, want one at the clock (%d ms)", id, quiet, clockMs())
		}
	}
	now++
	b := beat(ti)
	if b.Millis() < clockMs()+lead {
		t.Fatalf("heartbeat %v after %d quiet ticks, want one at least %d ms ahead of the clock (%d ms)", b, quiet, lead, clockMs())
	}
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	if id := lastTxn(t, ti.io, "n1").ID; id <= b {
		t.Fatalf("txn %v after the heartbeat %v that led", id, b)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		ti.io.take(n)
	}
	// The txn ended the quiet: the next heartbeats no longer move ahead.
	ti.Tick()
	now++
	if id := beat(ti); id.Millis() != b.Millis() {
		t.Fatalf("heartbeat %v right after a txn; want one where the generator stands (%d ms), not further ahead", id, b.Millis())
	}

	// A clock before the ID epoch: heartbeats go on, none ahead.
	broken := txnid.EpochUnixMillis - 5
	ti = newLead(lead, &broken)
	for range quiet + 1 {
		if id := beat(ti); id.Millis() > 1 {
			t.Fatalf("heartbeat %v on a clock before the epoch", id)
		}
	}
	// No lead configured.
	now = txnid.EpochUnixMillis + 1_000_000_000
	ti = newLead(0, &now)
	for range quiet + 2 {
		now++
		if id := beat(ti); id.Millis() != clockMs() {
			t.Fatalf("heartbeat %v with no lead, want one at the clock (%d ms)", id, clockMs())
		}
	}
}

// TestInitiatorMissed: a partition sequenced while a node holding a
// replica of it has no feed (taken for dead, or its send failed) is named
// in the hello of the next feed there, and only until that feed opens;
// while the dial is under way, no txn of its partitions is sequenced.
// A feed that broke to a process that lives counts as reaching it.
func TestInitiatorMissed(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.openAll(t)
	// n3 is taken for dead: its feed stays, and a txn still reaches it.
	delete(ti.view.Nodes, "n3")
	ti.SetView(ti.view)
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	if got := ti.Missed("n3"); len(got) != 0 {
		t.Fatalf("n3 missed %v though its feed is open", got)
	}
	// Its feed breaks: now it misses partition 0's txns.
	ti.FeedLost("n3")
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	if got := ti.Missed("n3"); !slices.Equal(got, []uint32{0}) {
		t.Fatalf("n3 missed %v, want [0]", got)
	}
	// A send that fails misses nothing: the feed's log keeps the txn for
	// when the feed, which breaks, resumes.
	ti.io.refuse["n1"] = true
	if err := ti.submit(t, 1, false); err != nil {
		t.Fatal(err)
	}
	if got := ti.Missed("n1"); len(got) != 0 || ti.LogBytes("n1") == 0 {
		t.Fatalf("n1 missed %v, its log %d bytes; want nothing missed, the txn logged", got, ti.LogBytes("n1"))
	}
	// n3 is back, a new process: the dial names what it missed, and
	// nothing of partition 0 is sequenced until the feed opens.
	ti.view.Nodes["n3"] = 2
	ti.SetView(ti.view)
	if want := "n3 2 [0]"; ti.io.dials[len(ti.io.dials)-1] != want {
		t.Fatalf("dials %v, want the last %q", ti.io.dials, want)
	}
	var unfed *UnfedError
	if err := ti.submit(t, 0, false); !errors.As(err, &unfed) || !slices.Equal(unfed.Nodes, []string{"n3"}) {
		t.Fatalf("call while n3 is dialled: %v", err)
	}
	// Taken for dead again while its dial is under way: still nothing of
	// partition 0, as a txn now would be missed there and not named in
	// the hello already sent.
	delete(ti.view.Nodes, "n3")
	if err := ti.submit(t, 0, false); !errors.As(err, &unfed) || !slices.Equal(unfed.Nodes, []string{"n3"}) {
		t.Fatalf("call while n3, taken for dead, is dialled: %v", err)
	}
	ti.view.Nodes["n3"] = 2
	ti.FeedOpened("n3", txnid.Zero)
	if got := ti.Missed("n3"); len(got) != 0 {
		t.Fatalf("n3 still missed %v once its feed opened", got)
	}
	// n2's feed breaks while its process lives: a txn goes into its log,
	// so nothing is missed or refused.
	ti.FeedLost("n2")
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	if got := ti.Missed("n2"); len(got) != 0 {
		t.Fatalf("n2 missed %v, its feed broke while its process lives", got)
	}
}

// TestInitiatorStaleProcess: a feed to a node whose process changed is
// closed; the next feed is dialled to the new process once it is lost.
func TestInitiatorStaleProcess(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.openAll(t)
	ti.view.Nodes["n2"] = 5
	ti.SetView(ti.view)
	if !slices.Equal(ti.io.closes, []string{"n2"}) || len(ti.io.dials) != 3 {
		t.Fatalf("closes %v, dials %v", ti.io.closes, ti.io.dials)
	}
	ti.FeedLost("n2")
	ti.SetView(ti.view)
	if ti.io.dials[3] != "n2 5 []" {
		t.Fatalf("dials %v", ti.io.dials)
	}
}

// TestInitiatorSkipSend: a skipped send is not waited for and not
// missed: it models a txn lost on the wire.
func TestInitiatorSkipSend(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.openAll(t)
	ti.cfg.Knobs.SkipSend = func(node string, _ txnid.ID) bool { return node == "n2" }
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	if len(ti.io.sent["n2"]) != 0 {
		t.Fatal("skipped send went out")
	}
	id := ti.gen.Last()
	ti.OnDone("n1", &wire.Done{ID: id})
	ti.OnDone("n3", &wire.Done{ID: id})
	if len(ti.reply) != 1 {
		t.Fatalf("%d replies, want 1: n2 was skipped", len(ti.reply))
	}
}

// TestTailRepair: the peers asked are the partition's other replicas but
// the initiator's; an unreachable live peer is asked again for as long
// as it lives, and neither it nor a dead peer fails the replica; a peer
// that no longer keeps txns past the replica's prefix does; a cut-short
// try does not count.
func TestTailRepair(t *testing.T) {
	boom := errors.New("boom")
	t.Run("peers", func(t *testing.T) {
		tr := NewTailRepair(3, []string{"n1", "n2", "n3", "n4"}, "n2", "n3")
		var got []string
		for p, ok := tr.Next(); ok; p, ok = tr.Next() {
			got = append(got, p)
			if tr.OnAnswer(p, RepairTry{PeerAlive: true}) {
				t.Fatal("retry after an answer")
			}
		}
		if !slices.Equal(got, []string{"n1", "n4"}) {
			t.Fatalf("peers %v", got)
		}
		if why, fail := tr.Verdict(); fail {
			t.Fatalf("failed: %s", why)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		tr := NewTailRepair(3, []string{"n1", "n2", "n4"}, "n2", "n3")
		p, _ := tr.Next()
		for range 1000 {
			if !tr.OnAnswer(p, RepairTry{Err: boom, PeerAlive: true}) {
				t.Fatal("a live peer that cannot be reached was given up")
			}
		}
		if tr.OnAnswer(p, RepairTry{Err: boom, PeerAlive: false}) {
			t.Fatal("retry of a peer that died")
		}
		p, _ = tr.Next()
		if tr.OnAnswer(p, RepairTry{PeerAlive: true}) {
			t.Fatal("retry after an answer")
		}
		if why, fail := tr.Verdict(); fail {
			t.Fatalf("a peer cut off, then dead, failed the replica: %s", why)
		}
	})
	t.Run("gone", func(t *testing.T) {
		tr := NewTailRepair(3, []string{"n1", "n2", "n4"}, "n2", "n3")
		p, _ := tr.Next()
		if tr.OnAnswer(p, RepairTry{Err: boom, Gone: true, PeerAlive: true}) {
			t.Fatal("retry of a peer that no longer keeps the txns")
		}
		p, _ = tr.Next()
		tr.OnAnswer(p, RepairTry{PeerAlive: true})
		why, fail := tr.Verdict()
		if !fail || why != "initiator 3's tail not repaired: [n1: boom]" {
			t.Fatalf("verdict %q %v", why, fail)
		}
	})
	t.Run("cut short", func(t *testing.T) {
		tr := NewTailRepair(3, []string{"n1", "n2"}, "n2", "n3")
		p, _ := tr.Next()
		if tr.OnAnswer(p, RepairTry{Err: boom, PeerAlive: true, Ended: true}) {
			t.Fatal("retry of a cut-short try")
		}
		if why, fail := tr.Verdict(); fail {
			t.Fatalf("node stopping failed the replica: %s", why)
		}
	})
}

// discardIO takes every message and asks nothing.
type discardIO struct{}

func (discardIO) Send(string, wire.Message) bool { return true }
func (discardIO) Dial(string, DialAsk)           {}
func (discardIO) Close(string)                   {}

// TestInitiatorSubmitAllocs: a call with no caller (a workload's)
// allocates its txn and nothing else, so a driver that offers a hundred
// thousand a second (the bench) does not feed the collector per replica.
func TestInitiatorSubmitAllocs(t *testing.T) {
	ti := newTestInitiator(t, 1)
	in, err := NewInitiator(InitiatorConfig{Node: "n9", ID: 9, Clock: func() int64 { return ti.now }, Partitions: 2, BeatTicks: 1}, discardIO{})
	if err != nil {
		t.Fatal(err)
	}
	in.SetView(ti.view)
	for _, n := range sortedKeys(ti.view.Nodes) {
		in.FeedOpened(n, txnid.Zero)
	}
	call := &wire.Call{Partition: 0, Proc: "upsert"}
	allocs := testing.AllocsPerRun(100, func() {
		if err := in.Submit(ti.view, true, call, nil); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Fatalf("%.1f allocations a call, want 1 (its txn)", allocs)
	}
}

// txnIDs returns the IDs of the txns among ms, in order.
func txnIDs(ms []wire.Message) []txnid.ID {
	var ids []txnid.ID
	for _, m := range ms {
		if t, ok := m.(*wire.Txn); ok {
			ids = append(ids, t.ID)
		}
	}
	return ids
}

// TestInitiatorFeedResumes: a feed that breaks loses nothing. The calls
// go on waiting for the node; the txns meant for it go into the feed's
// log; the next view dials the same process asking to resume above what
// it acknowledged; its answer says where it stopped, and everything
// above goes out again in order. A call whose txn the node got before
// the break stops waiting: its Done was lost with the connection.
func TestInitiatorFeedResumes(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.openAll(t)
	var ids []txnid.ID
	submit := func() {
		t.Helper()
		if err := ti.submit(t, 0, false); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ti.gen.Last())
	}
	for range 3 {
		submit()
	}
	ti.FeedAcked("n2", ids[0])
	ti.io.take("n2")
	ti.FeedLost("n2")
	submit()
	submit()
	if got := ti.io.take("n2"); len(got) != 0 {
		t.Fatalf("sent %v on a broken feed", got)
	}
	// Every other replica answers; n2 is still waited for.
	for _, id := range ids {
		ti.OnDone("n1", &wire.Done{ID: id})
		ti.OnDone("n3", &wire.Done{ID: id})
	}
	if len(ti.reply) != 0 {
		t.Fatalf("answered without n2, whose feed only broke: %+v", ti.reply[0])
	}
	ti.SetView(ti.view)
	if want := fmt.Sprintf("n2 1 [] resume above %v", ids[0]); ti.io.dials[len(ti.io.dials)-1] != want {
		t.Fatalf("dials %v, want the last %q", ti.io.dials, want)
	}
	// A call while the dial is under way is taken, into the log.
	submit()
	ti.OnDone("n1", &wire.Done{ID: ids[5]})
	ti.OnDone("n3", &wire.Done{ID: ids[5]})
	// n2 got up to the second txn before the break.
	ti.FeedResumed("n2", ids[1])
	if len(ti.reply) != 2 || ti.reply[0].ID != ids[0] || ti.reply[1].ID != ids[1] {
		t.Fatalf("replies %+v; want the two calls n2 got before the break", ti.reply)
	}
	if got := txnIDs(ti.io.take("n2")); !slices.Equal(got, ids[2:]) {
		t.Fatalf("sent again %v, want %v", got, ids[2:])
	}
	for _, id := range ids[2:] {
		ti.OnDone("n2", &wire.Done{ID: id})
	}
	if len(ti.reply) != len(ids) || ti.Pending() != 0 {
		t.Fatalf("%d replies, %d pending; want %d, 0", len(ti.reply), ti.Pending(), len(ids))
	}
	ti.FeedAcked("n2", ids[5])
	if b := ti.LogBytes("n2"); b != 0 {
		t.Fatalf("log of %d bytes once n2 acknowledged everything", b)
	}
	// The resumed feed is heartbeaten as any other once idle.
	ti.Tick()
	ti.Tick()
	if ms := ti.io.take("n2"); len(ms) != 1 || ms[0].Type() != wire.MsgBeat {
		t.Fatalf("after two ticks, sent %v; want a heartbeat", ms)
	}
}

// TestInitiatorFencedNoLog: once a node fenced this process, a broken
// feed's log no longer counts: a call whose partition has a replica on
// that node fails definitely, sent nowhere, instead of going to the other
// replicas and into the log. The node may have taken the process for dead
// too, and would drop the log; the others would run the txn alone.
func TestInitiatorFencedNoLog(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.openAll(t)
	ti.FeedLost("n2")
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatalf("before a fence, a call with n2's feed broken: %v", err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		ti.io.take(n)
	}
	ti.Fenced()
	err := ti.submit(t, 0, false)
	var unfed *UnfedError
	if !errors.As(err, &unfed) || !slices.Equal(unfed.Nodes, []string{"n2"}) {
		t.Fatalf("after a fence, a call with n2's feed broken: %v, want it unfed for n2", err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if got := ti.io.take(n); len(txnIDs(got)) != 0 {
			t.Fatalf("the refused call sent %v to %s", got, n)
		}
	}
	// Its feed open again, n2 is fed as before.
	ti.SetView(ti.view)
	ti.FeedOpened("n2", txnid.Zero)
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatalf("with every feed open after the fence: %v", err)
	}
}

// TestInitiatorAbandon: a process that learns it was fenced answers
// every call in flight as of unknown outcome at once, one a replica had
// answered too, instead of leaving its callers to their timeouts; and it
// sequences no call from then on with a feed broken (Fenced).
func TestInitiatorAbandon(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.openAll(t)
	var first txnid.ID
	for i := range 2 {
		if err := ti.submit(t, 0, false); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = lastTxn(t, ti.io, "n1").ID
		}
	}
	ti.OnDone("n1", &wire.Done{ID: first, Out: []byte("a")})
	if len(ti.reply) != 0 || ti.Pending() != 2 {
		t.Fatalf("before the abandon: %d replies, %d pending", len(ti.reply), ti.Pending())
	}
	ti.Abandon("fenced")
	if len(ti.reply) != 2 || ti.Pending() != 0 {
		t.Fatalf("after the abandon: %d replies, %d pending; want 2, 0", len(ti.reply), ti.Pending())
	}
	for _, r := range ti.reply {
		if !r.Uncertain || r.Err != "fenced" || r.Out != nil {
			t.Fatalf("reply %+v, want uncertain, fenced, no output", r)
		}
	}
	ti.FeedLost("n2")
	var unfed *UnfedError
	if err := ti.submit(t, 0, false); !errors.As(err, &unfed) {
		t.Fatalf("a call after the abandon with n2's feed broken: %v, want unfed", err)
	}
}

// TestInitiatorFeedLogBound: past FeedLogBytesMax a broken feed's log
// takes no more. A txn of a partition other live replicas take is
// missed there (the next hello names the partition) and the call waits
// for the others only; the dial to resume asks above the same Kept, so
// the receiver resumes and fails only the partitions named. A call whose
// only live replica is behind the full log is refused, nothing sent
// (ErrFeedLogFull): before, the oldest txns went, the receiver refused
// the resume and failed every replica, the partition's last live copy
// among them (the simulator, seed 3014971). A dial that fails keeps the
// log; a refused resume starts it anew; a new process of the node drops
// it.
func TestInitiatorFeedLogBound(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.cfg.FeedLogBytesMax = 3 * (len("upsert") + 64)
	ti.openAll(t)
	ti.FeedLost("n2")
	var ids []txnid.ID
	for range 5 {
		if err := ti.submit(t, 0, false); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ti.gen.Last())
		// The open feeds' nodes read it (TestInitiatorOpenFeedLogFull).
		ti.FeedAcked("n1", ti.gen.Last())
		ti.FeedAcked("n3", ti.gen.Last())
	}
	if got := ti.Missed("n2"); !slices.Equal(got, []uint32{0}) {
		t.Fatalf("n2 missed %v, want [0]", got)
	}
	if ti.LogBytes("n2") != ti.cfg.FeedLogBytesMax {
		t.Fatalf("n2's log %d bytes, want its first 3 txns: %d", ti.LogBytes("n2"), ti.cfg.FeedLogBytesMax)
	}
	for _, id := range ids {
		ti.OnDone("n1", &wire.Done{ID: id})
		ti.OnDone("n3", &wire.Done{ID: id})
	}
	if len(ti.reply) != 2 || ti.reply[0].Err != "" || ti.reply[1].Err != "" {
		t.Fatalf("replies %+v, want the 2 calls n2's log did not take answered by n1 and n3", ti.reply)
	}
	ti.reply = nil
	ti.SetView(ti.view)
	if want := "n2 1 [0] resume above t0.c0.i0"; ti.io.dials[len(ti.io.dials)-1] != want {
		t.Fatalf("dials %v, want the last %q", ti.io.dials, want)
	}
	ti.DialFailed("n2")
	ti.SetView(ti.view)
	if want := "n2 1 [0] resume above t0.c0.i0"; ti.io.dials[len(ti.io.dials)-1] != want {
		t.Fatalf("after a failed dial, dials %v, want the last %q", ti.io.dials, want)
	}
	// The receiver refuses: a floor, not a resume. The calls stop waiting
	// for n2, each of unknown outcome whatever the others answered, and
	// the log starts anew.
	ti.FeedOpened("n2", txnid.Zero)
	if len(ti.reply) != 3 || ti.LogBytes("n2") != 0 {
		t.Fatalf("%d replies, log %d bytes; want 3 replies, an empty log", len(ti.reply), ti.LogBytes("n2"))
	}
	for _, r := range ti.reply {
		if !r.Uncertain || !strings.Contains(r.Err, "did not take it up") {
			t.Fatalf("reply %+v after n2 refused to resume; want uncertain", r)
		}
	}
	ti.reply = nil
	// n1 holds partition 1's only replica: once its broken feed's log is
	// full, a call of partition 1 is refused with nothing sent, and
	// nothing of partition 1 is missed there.
	ti.FeedAcked("n1", ids[len(ids)-1])
	ti.FeedLost("n1")
	for i := range 4 {
		err := ti.submit(t, 1, false)
		if i < 3 && err != nil {
			t.Fatalf("call %d of partition 1 with n1's log not full: %v", i, err)
		}
		if i == 3 && !errors.Is(err, ErrFeedLogFull) {
			t.Fatalf("call of partition 1 with n1's log full: %v, want ErrFeedLogFull", err)
		}
	}
	if got := ti.Missed("n1"); len(got) != 0 {
		t.Fatalf("n1 missed %v, want nothing", got)
	}
	// A new process of n3 while its feed is broken: its log goes, and
	// the calls stop waiting for it.
	ti.FeedAcked("n3", ids[len(ids)-1])
	ti.FeedLost("n3")
	ti.view.Placement[1] = append(ti.view.Placement[1], ReplicaPlace{Node: "n2", Live: true})
	if err := ti.submit(t, 1, false); err != nil {
		t.Fatal(err)
	}
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	ti.OnDone("n2", &wire.Done{ID: ti.gen.Last()})
	ti.view.Nodes["n3"] = 2
	ti.SetView(ti.view)
	if ti.LogBytes("n3") != 0 || ti.io.dials[len(ti.io.dials)-1] != "n3 2 []" {
		t.Fatalf("n3's log %d bytes, dials %v", ti.LogBytes("n3"), ti.io.dials)
	}
}

// TestInitiatorResumeAfterLogFull: the log goes on taking txns while a
// dial to resume is out, and once full misses the node what it does not
// take, after that dial's hello named what was missed. The receiver's
// resume must then not go ahead: the feed is closed at once with nothing
// sent, and the next dial, asking above the same Kept, names the
// partition, so the receiver resumes and fails only its replicas there.
// Before, a full log dropped its oldest above the hello's Kept, and the
// receiver, refused the next resume, failed every replica (simulator
// seed 5238).
func TestInitiatorResumeAfterLogFull(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.cfg.FeedLogBytesMax = 2 * (len("upsert") + 64)
	ti.openAll(t)
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	at := ti.gen.Last()
	ti.FeedAcked("n2", at)
	ti.io.take("n2")
	ti.FeedLost("n2")
	ti.SetView(ti.view)
	for range 3 {
		if err := ti.submit(t, 0, false); err != nil {
			t.Fatal(err)
		}
		ti.FeedAcked("n1", ti.gen.Last())
		ti.FeedAcked("n3", ti.gen.Last())
	}
	ti.FeedResumed("n2", at)
	if got := ti.io.take("n2"); len(got) != 0 || !slices.Equal(ti.io.closes, []string{"n2"}) {
		t.Fatalf("sent %v, closed %v; want nothing sent and the feed to n2 closed", got, ti.io.closes)
	}
	ti.FeedLost("n2")
	ti.SetView(ti.view)
	if d, want := ti.io.dials[len(ti.io.dials)-1], "n2 1 [0] resume above "+at.String(); d != want {
		t.Fatalf("dials %v; want the last %q", ti.io.dials, want)
	}
	ti.FeedResumed("n2", at)
	if got := ti.io.take("n2"); len(got) != 2 || len(ti.Missed("n2")) != 0 {
		t.Fatalf("sent %v, missed %v after the resume; want the log's 2 txns, nothing missed", got, ti.Missed("n2"))
	}
}

// TestInitiatorJoinsBeforeItSends: with Joins, a partition's first call
// asks each node holding one of its replicas to track the initiator
// (wire.Join) and is refused, sent nowhere, until every one answered;
// its txn then goes out above the highest floor answered. A new feed to
// a node asks again; a resumed one keeps what was joined and asks again
// what was not answered; a node placed later is asked at the next view,
// whether or not a call comes.
func TestInitiatorJoinsBeforeItSends(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.cfg.Joins = true
	ti.openAll(t)
	var unfed *UnfedError
	if err := ti.submit(t, 0, false); !errors.As(err, &unfed) || !unfed.Joining || !slices.Equal(unfed.Nodes, []string{"n1", "n2", "n3"}) {
		t.Fatalf("first call: %v, want refused while n1, n2, n3 join", err)
	}
	joins := func(node string) []uint32 {
		var ps []uint32
		for _, m := range ti.io.take(node) {
			switch m := m.(type) {
			case *wire.Join:
				ps = append(ps, m.Partition)
			case *wire.Txn:
				t.Fatalf("txn %v sent to %s before its join was answered", m.ID, node)
			}
		}
		return ps
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if ps := joins(n); !slices.Equal(ps, []uint32{0}) {
			t.Fatalf("joins sent to %s: %v, want [0]", n, ps)
		}
	}
	// Asked once per feed: a second call asks nothing more.
	if err := ti.submit(t, 0, false); !errors.As(err, &unfed) || !unfed.Joining {
		t.Fatalf("second call: %v, want refused while joining", err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		if ps := joins(n); len(ps) != 0 {
			t.Fatalf("%s asked again: %v", n, ps)
		}
	}
	floor := txnid.Make(ti.now-txnid.EpochUnixMillis+5000, 3, 1)
	ti.Joined("n1", 0, txnid.Zero)
	ti.Joined("n2", 0, floor)
	ti.Joined("n2", 1, floor) // never asked: ignored
	if err := ti.submit(t, 0, false); !errors.As(err, &unfed) || !slices.Equal(unfed.Nodes, []string{"n3"}) {
		t.Fatalf("call with n3 not joined: %v", err)
	}
	ti.Joined("n3", 0, txnid.Zero)
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	if id := lastTxn(t, ti.io, "n3").ID; id <= floor {
		t.Fatalf("txn %v at or below the floor %v n2 answered", id, floor)
	}
	// Partition 1 (on n1 alone) is joined on its own.
	if err := ti.submit(t, 1, false); !errors.As(err, &unfed) || !slices.Equal(unfed.Nodes, []string{"n1"}) {
		t.Fatalf("partition 1: %v, want its own join", err)
	}
	ti.io.take("n1")
	ti.Joined("n1", 1, txnid.Zero)

	// n2's feed breaks and resumes: still joined.
	ti.FeedLost("n2")
	ti.SetView(ti.view)
	ti.FeedResumed("n2", lastTxn(t, ti.io, "n2").ID)
	ti.io.take("n2")
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatalf("after n2 resumed: %v", err)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		ti.io.take(n)
	}
	// n3 restarts: the new process's feed joins afresh, at the next view.
	ti.view.Nodes["n3"] = 2
	ti.SetView(ti.view)
	ti.FeedLost("n3")
	ti.SetView(ti.view)
	ti.FeedOpened("n3", txnid.Zero)
	ti.io.take("n3")
	ti.SetView(ti.view)
	if ps := joins("n3"); !slices.Equal(ps, []uint32{0}) {
		t.Fatalf("joins to n3's new process: %v, want [0]", ps)
	}
	// A node placed later for partition 1 is asked at the next view.
	ti.view.Placement[1] = append(ti.view.Placement[1], ReplicaPlace{Node: "n2"})
	ti.SetView(ti.view)
	if ps := joins("n2"); !slices.Equal(ps, []uint32{1}) {
		t.Fatalf("joins to n2 once placed for partition 1: %v, want [1]", ps)
	}
	// Without Joins, nothing of it.
	plain := newTestInitiator(t, 1)
	plain.openAll(t)
	if err := plain.submit(t, 0, false); err != nil {
		t.Fatal(err)
	}
	if m := plain.io.sent["n1"]; len(m) != 1 || m[0].Type() != wire.MsgTxn {
		t.Fatalf("without Joins, sent %v", m)
	}
}

// TestInitiatorJoinWaitsForNoDeadNode: with Joins, a node the view no
// longer has, whose feed stays open with its join not answered (a
// paused process keeps its connections), is asked but not waited for,
// as Unfed waits for no dead node; the txn still goes to it, whose
// replica, not tracking the initiator, refuses it. Waited for, the
// partition sequenced nothing until that process woke (the simulator,
// joins on: a source node that died with its feeds open held every
// initiator's txns for the rest of the run).
func TestInitiatorJoinWaitsForNoDeadNode(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.cfg.Joins = true
	ti.openAll(t)
	var unfed *UnfedError
	if err := ti.submit(t, 0, false); !errors.As(err, &unfed) || !unfed.Joining {
		t.Fatalf("first call: %v, want refused while joining", err)
	}
	ti.Joined("n1", 0, txnid.Zero)
	ti.Joined("n2", 0, txnid.Zero)
	if err := ti.submit(t, 0, false); !errors.As(err, &unfed) || !slices.Equal(unfed.Nodes, []string{"n3"}) {
		t.Fatalf("call with n3 not joined: %v", err)
	}
	delete(ti.view.Nodes, "n3") // taken for dead; its feed stays open
	ti.SetView(ti.view)
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatalf("call with n3 out of the view: %v, want sequenced", err)
	}
	if m := lastTxn(t, ti.io, "n3"); m.ID != ti.gen.Last() {
		t.Fatalf("last txn to n3 %v, want %v", m.ID, ti.gen.Last())
	}
	// With n3's replica the only live one, the call is refused: sent, it
	// would fail the partition's last live replica.
	for i, rp := range ti.view.Placement[0] {
		ti.view.Placement[0][i].Live = rp.Node == "n3"
	}
	ti.SetView(ti.view)
	last := ti.gen.Last()
	if err := ti.submit(t, 0, false); err == nil || !strings.Contains(err.Error(), "no live replica") {
		t.Fatalf("call with only n3's unjoined replica live: %v, want refused for no live replica", err)
	}
	if ti.gen.Last() != last {
		t.Fatalf("a refused call took an ID")
	}
}

// TestInitiatorHolderJoinsAtView: with Joins, an initiator joins each
// partition its own node holds a replica of at the next view, on every
// feed to a node holding one, before any call: a replica that tracks no
// initiator cannot rejoin, and one nobody wrote to since it restarted
// would never hear any.
func TestInitiatorHolderJoinsAtView(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.cfg.Node, ti.cfg.Joins = "n1", true
	ti.openAll(t)
	ti.SetView(ti.view)
	want := map[string][]uint32{"n1": {0, 1}, "n2": {0}, "n3": {0}}
	for node, ps := range want {
		var got []uint32
		for _, m := range ti.io.take(node) {
			if j, ok := m.(*wire.Join); ok {
				got = append(got, j.Partition)
			}
		}
		if !slices.Equal(got, ps) {
			t.Errorf("joins sent to %s at the view: %v, want %v", node, got, ps)
		}
	}
}

// TestInitiatorCallTicks: a call still waiting for a replica after
// CallTicks ticks is answered as of unknown outcome, naming the replica
// and its feed, and listed by Expired once; the calls answered before it,
// and one sequenced after it that is not yet due, are left alone.
func TestInitiatorCallTicks(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.cfg.CallTicks = 5
	ti.openAll(t)
	ti.FeedLost("n3")
	submit := func() txnid.ID {
		t.Helper()
		if err := ti.submit(t, 0, false); err != nil {
			t.Fatal(err)
		}
		return ti.gen.Last()
	}
	answered := submit()
	stuck := submit()
	for _, n := range []string{"n1", "n2", "n3"} {
		ti.OnDone(n, &wire.Done{ID: answered})
	}
	ti.OnDone("n1", &wire.Done{ID: stuck})
	ti.OnDone("n2", &wire.Done{ID: stuck})
	for range 3 {
		ti.Tick()
	}
	ti.now += 2_000
	later := submit()
	ti.Tick()
	if len(ti.reply) != 1 || ti.reply[0].ID != answered {
		t.Fatalf("replies before CallTicks: %+v", ti.reply)
	}
	if e := ti.Expired(); len(e) != 0 {
		t.Fatalf("expired before CallTicks: %+v", e)
	}
	ti.Tick()
	if len(ti.reply) != 2 {
		t.Fatalf("%d replies after CallTicks, want 2", len(ti.reply))
	}
	r := ti.reply[1]
	if r.ID != stuck || !r.Uncertain || r.Out != nil || !strings.Contains(r.Err, "within 2000 ms from the replica on n3 (feed broken, 3 txns kept for it)") {
		t.Fatalf("expired reply %+v", r)
	}
	e := ti.Expired()
	if len(e) != 1 || e[0].ID != stuck || e[0].Partition != 0 || len(e[0].Waited) != 1 || e[0].Millis != 2_000 {
		t.Fatalf("Expired() = %+v", e)
	}
	if e := ti.Expired(); len(e) != 0 {
		t.Fatalf("Expired() again = %+v", e)
	}
	if ti.Pending() != 1 {
		t.Fatalf("%d calls pending, want the later one", ti.Pending())
	}
	for range 4 {
		ti.Tick()
	}
	if len(ti.reply) != 3 || ti.reply[2].ID != later || !ti.reply[2].Uncertain {
		t.Fatalf("the later call at its CallTicks: %+v", ti.reply)
	}
}

// TestTails: a replica's prefix of each initiator is the highest ID it
// took in, txn or heartbeat; a peer past a prefix gets the kept txns
// above it that the asked-for incarnation or an older one sent, in
// order; once the oldest were dropped to make room, a prefix below them
// is answered with an error (RepairTry.Gone), not a short tail.
func TestTails(t *testing.T) {
	var tl Tails
	id := func(c uint64) txnid.ID {
		return txnid.Make(1000+int64(c/txnid.IDsPerMillisMax), uint32(c%txnid.IDsPerMillisMax), 3)
	}
	if got, err := tl.After(3, txnid.Zero, 1); got != nil || err != nil {
		t.Fatalf("nothing taken: %v %v", got, err)
	}
	for c := range uint64(4) {
		inv := partition.Invocation{ID: id(c), Proc: "upsert"}
		tl.Took(inv.ID, &inv, 1+c/2) // c0, c1 from process 1; c2, c3 from 2
	}
	tl.Took(id(5), nil, 2) // a heartbeat
	if tl.Last(3) != id(5) || tl.Last(4) != txnid.Zero {
		t.Fatalf("last %v %v", tl.Last(3), tl.Last(4))
	}
	ids := func(invs []partition.Invocation) (out []txnid.ID) {
		for _, inv := range invs {
			out = append(out, inv.ID)
		}
		return out
	}
	if got, err := tl.After(3, id(0), 1); err != nil || !slices.Equal(ids(got), []txnid.ID{id(1)}) {
		t.Fatalf("after c0, process 1: %v %v", ids(got), err)
	}
	if got, err := tl.After(3, id(0), 2); err != nil || !slices.Equal(ids(got), []txnid.ID{id(1), id(2), id(3)}) {
		t.Fatalf("after c0, process 2: %v %v", ids(got), err)
	}
	for c := uint64(6); c < 6+TailKeptMax; c++ {
		inv := partition.Invocation{ID: id(c), Proc: "upsert"}
		tl.Took(inv.ID, &inv, 2)
	}
	if _, err := tl.After(3, id(0), 2); err == nil {
		t.Fatal("a prefix below what was dropped answered without an error")
	}
	got, err := tl.After(3, id(5+TailKeptMax-2), 2)
	if err != nil || !slices.Equal(ids(got), []txnid.ID{id(5 + TailKeptMax - 1), id(5 + TailKeptMax)}) {
		t.Fatalf("after the kept ones' last but two: %v %v", ids(got), err)
	}
}

// TestInitiatorOpenFeedLogFull: an open feed's log holds what its node
// has not acknowledged, and once full it takes no more: a call whose txn
// would reach that node is refused with nothing sent (ErrFeedLogFull)
// until the node acknowledges, and nothing the log held is dropped. A
// break then resumes where the node stopped and sends every txn again.
// Before, the open feed's log dropped its oldest, sent and not yet
// acknowledged; a break with one of them in flight left a resume the
// node could not take, and it failed its replicas, the partition's only
// live copy among them (the simulator, seed 2031481811).
func TestInitiatorOpenFeedLogFull(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.cfg.FeedLogBytesMax = 3 * (len("upsert") + 64)
	ti.openAll(t)
	var ids []txnid.ID
	for range 3 {
		if err := ti.submit(t, 1, false); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ti.gen.Last())
	}
	err := ti.submit(t, 1, false)
	if !errors.Is(err, ErrFeedLogFull) || !strings.Contains(err.Error(), "node n1") {
		t.Fatalf("a fourth call with n1's open log full: %v, want ErrFeedLogFull naming n1", err)
	}
	if ti.gen.Last() != ids[2] {
		t.Fatalf("the refused call was sequenced: %v", ti.gen.Last())
	}
	if got := txnIDs(ti.io.take("n1")); !slices.Equal(got, ids) {
		t.Fatalf("sent %v to n1, want %v", got, ids)
	}
	// n1 read the first: room for one more.
	ti.FeedAcked("n1", ids[0])
	if err := ti.submit(t, 1, false); err != nil {
		t.Fatalf("a call once n1 acknowledged one: %v", err)
	}
	ids = append(ids, ti.gen.Last())
	ti.io.take("n1")
	// The feed breaks with the rest in flight, and resumes where n1
	// stopped: every txn above goes again, none was dropped.
	ti.FeedLost("n1")
	ti.SetView(ti.view)
	if want := fmt.Sprintf("n1 1 [] resume above %v", ids[0]); ti.io.dials[len(ti.io.dials)-1] != want {
		t.Fatalf("dials %v, want the last %q", ti.io.dials, want)
	}
	ti.FeedResumed("n1", ids[0])
	if len(ti.io.closes) != 0 {
		t.Fatalf("feeds closed %v: the resume was refused", ti.io.closes)
	}
	if got := txnIDs(ti.io.take("n1")); !slices.Equal(got, ids[1:]) {
		t.Fatalf("sent again %v, want %v", got, ids[1:])
	}
}

// TestInitiatorOpenFeedLogFullTakenForDead: a node whose open feed's log
// is full and that the view no longer has (taken for dead: stopped past
// its fence, its connection still up) is not waited for. Its feed is
// closed as a dead process's would be, the call goes on to the other
// replicas, and the partition is named missed for its next hello. Left
// open, the full log would refuse the partition's calls for as long as
// the process stays stopped.
func TestInitiatorOpenFeedLogFullTakenForDead(t *testing.T) {
	ti := newTestInitiator(t, 1)
	ti.cfg.FeedLogBytesMax = 3 * (len("upsert") + 64)
	ti.openAll(t)
	for range 3 {
		if err := ti.submit(t, 0, false); err != nil {
			t.Fatal(err)
		}
		ti.FeedAcked("n2", ti.gen.Last())
		ti.FeedAcked("n3", ti.gen.Last())
	}
	if err := ti.submit(t, 0, false); !errors.Is(err, ErrFeedLogFull) {
		t.Fatalf("n1's open log full, n1 alive: %v, want ErrFeedLogFull", err)
	}
	delete(ti.view.Nodes, "n1")
	ti.SetView(ti.view)
	for _, n := range []string{"n1", "n2", "n3"} {
		ti.io.take(n)
	}
	if err := ti.submit(t, 0, false); err != nil {
		t.Fatalf("n1 taken for dead with its open log full: %v, want the call sequenced", err)
	}
	if !slices.Equal(ti.io.closes, []string{"n1"}) {
		t.Fatalf("closed %v, want n1's feed", ti.io.closes)
	}
	if got := ti.Missed("n1"); !slices.Equal(got, []uint32{0}) {
		t.Fatalf("n1 missed %v, want [0]", got)
	}
	id := ti.gen.Last()
	if got := txnIDs(ti.io.take("n1")); len(got) != 0 {
		t.Fatalf("sent %v to n1", got)
	}
	for _, n := range []string{"n2", "n3"} {
		if got := txnIDs(ti.io.take(n)); !slices.Equal(got, []txnid.ID{id}) {
			t.Fatalf("sent %v to %s, want [%v]", got, n, id)
		}
	}
}
