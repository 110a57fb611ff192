package recovery

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

var kvSchema = partition.Schema{
	Name:    "kv",
	Columns: []partition.Column{{Name: "k", Type: wire.TypeBytes}, {Name: "v", Type: wire.TypeBytes}, {Name: "n", Type: wire.TypeInt64}},
	Key:     []int{0},
}

func kvKey(i int) []byte {
	var k [16]byte
	binary.BigEndian.PutUint64(k[:], uint64(i))
	binary.BigEndian.PutUint64(k[8:], uint64(i)*0x9e3779b97f4a7c15)
	return k[:]
}

func newReplica(t testing.TB, initiators []txnid.Initiator) *partition.Executor {
	t.Helper()
	p := partition.New()
	if _, err := p.CreateTable(kvSchema); err != nil {
		t.Fatal(err)
	}
	e := partition.NewExecutor(p, partition.NewBuiltinRegistry(), partition.ExecutorConfig{QueueTxnsMax: 1 << 20})
	for _, in := range initiators {
		e.AddInitiator(in)
	}
	return e
}

// inProcess is the smallest driver: the two processors in one loop, each
// message delivered at once and in order.
type inProcess struct {
	t        *testing.T
	rng      *rand.Rand
	now      int64
	gens     []*txnid.Generator
	src, dst *partition.Executor
	source   *Source
	dest     *Destination
	keys     int
	enc      wire.TupleEncoder
	// toDest and toSource are the two directions of the link, FIFO.
	toDest, toSource []wire.Message
}

func newInProcess(t *testing.T, seed uint64, rows int, scfg SourceConfig) *inProcess {
	ins := []txnid.Initiator{1, 2}
	r := &inProcess{t: t, rng: rand.New(rand.NewPCG(seed, 9)), now: txnid.EpochUnixMillis + 5000, keys: rows * 2}
	for _, in := range ins {
		g, err := txnid.NewGenerator(in, func() int64 { return r.now })
		if err != nil {
			t.Fatal(err)
		}
		r.gens = append(r.gens, g)
	}
	r.src = newReplica(t, ins)
	tbl := r.src.Partition().TableByName("kv")
	for i := 0; i < rows; i++ {
		if _, err := tbl.Insert([]wire.Value{wire.Bytes(kvKey(i)), wire.Bytes([]byte("initial value")), wire.Int64(int64(i))}); err != nil {
			t.Fatal(err)
		}
	}
	r.dst = newReplica(t, ins)
	h := wire.MsgHeader{Epoch: 7, Partition: 3}
	scfg.Header = h
	var err error
	if r.source, err = NewSource(r.src, scfg); err != nil {
		t.Fatal(err)
	}
	if r.dest, err = NewDestination(r.dst, DestinationConfig{Header: h, Initiators: ins, StallTicksMax: 50, HeartbeatTicks: 5}); err != nil {
		t.Fatal(err)
	}
	return r
}

// feed sends one random txn or heartbeat from a random initiator to both
// replicas, as an initiator does.
func (r *inProcess) feed(destToo bool) {
	r.feedOne(destToo)
}

// feedOne sends one random txn or heartbeat to the source, and to the
// destination if destToo, and returns it; a heartbeat has no Proc.
func (r *inProcess) feedOne(destToo bool) partition.Invocation {
	r.now += int64(r.rng.IntN(2))
	g := r.gens[r.rng.IntN(len(r.gens))]
	id := g.Next()
	if r.rng.IntN(4) == 0 {
		if err := r.src.Heartbeat(id); err != nil {
			r.t.Fatal(err)
		}
		if destToo {
			if err := r.dest.OnHeartbeat(id); err != nil {
				r.t.Fatal(err)
			}
		}
		return partition.Invocation{ID: id}
	}
	k := wire.Bytes(kvKey(r.rng.IntN(r.keys)))
	var vals []wire.Value
	proc := partition.ProcUpsert
	// Increments are not idempotent, so a txn executed twice (or not at
	// all) shows in the digest.
	switch r.rng.IntN(5) {
	case 0:
		proc, vals = partition.ProcDelete, []wire.Value{wire.String("kv"), k}
	case 1, 2:
		proc, vals = partition.ProcIncrement, []wire.Value{wire.String("kv"), wire.String("n"), wire.Int64(1 + r.rng.Int64N(9)), k}
	default:
		v := make([]byte, r.rng.IntN(40))
		vals = []wire.Value{wire.String("kv"), k, wire.Bytes(v), wire.Int64(int64(id))}
	}
	params, err := r.enc.AppendTuple(nil, vals)
	if err != nil {
		r.t.Fatal(err)
	}
	inv := partition.Invocation{ID: id, Proc: proc, Params: params}
	if err := r.src.Offer(inv); err != nil {
		r.t.Fatal(err)
	}
	if destToo {
		if err := r.dest.OnTxn(inv); err != nil {
			r.t.Fatal(err)
		}
	}
	return inv
}

// exchange delivers a few messages each way, in order; the rest wait in
// the links for the next call, so transactions interleave with the stream.
func (r *inProcess) exchange() { r.exchangeUntil(func() bool { return false }) }

// exchangeUntil delivers up to a few messages each way, one at a time,
// stopping early once stop holds.
func (r *inProcess) exchangeUntil(stop func() bool) {
	r.toDest = append(r.toDest, r.source.Outbox()...)
	r.toSource = append(r.toSource, r.dest.Outbox()...)
	for n := 1 + r.rng.IntN(3); n > 0 && !stop(); n-- {
		if len(r.toDest) > 0 {
			m := r.toDest[0]
			r.toDest = r.toDest[1:]
			_ = r.dest.OnMessage(m)
		}
		if stop() {
			return
		}
		if len(r.toSource) > 0 {
			m := r.toSource[0]
			r.toSource = r.toSource[1:]
			_ = r.source.OnMessage(m)
		}
		r.toDest = append(r.toDest, r.source.Outbox()...)
		r.toSource = append(r.toSource, r.dest.Outbox()...)
	}
}

// rejoin runs the attempt until both sides have ended (the source is done
// only once the destination's HandoffAck reached it), up to rounds rounds
// of: a txn or heartbeat to both, a few txns on the source, after (if
// set), a tick of both every third round, and an exchange. It fails the
// test unless the destination ends live and the source done.
func (r *inProcess) rejoin(t *testing.T, seed uint64, rounds int, after func()) {
	t.Helper()
	for i := 0; i < rounds && !(r.dest.State().Final() && r.source.State().Final()); i++ {
		r.feed(true)
		r.stepSource(r.rng.IntN(3))
		if after != nil {
			after()
		}
		if i%3 == 0 {
			r.source.Tick()
			r.dest.Tick()
		}
		r.exchange()
	}
	if r.dest.State() != StateLive || r.source.State() != StateDone {
		t.Fatalf("seed %d: destination %s (%v), source %s (%v)", seed, r.dest.State(), r.dest.Err(), r.source.State(), r.source.Err())
	}
}

// stepSource runs up to n ready txns on the source, pumping between them.
func (r *inProcess) stepSource(n int) {
	for ; n > 0; n-- {
		if _, ok := r.src.Step(); !ok {
			break
		}
		r.source.Pump()
	}
	r.source.Pump()
}

func drainExec(e *partition.Executor) {
	for {
		if _, ok := e.Step(); !ok {
			return
		}
	}
}

func TestRejoinInProcess(t *testing.T) {
	var multiRound, withDeltas, withDropped int
	for seed := uint64(1); seed <= 40; seed++ {
		cfg := DefaultSourceConfig(wire.MsgHeader{})
		cfg.Stream.BlockBytesMax = 1 << (6 + seed%8) // 64 B .. 8 KiB: many blocks and rounds
		cfg.WindowBlocksMax = 1 + int(seed%4)
		cfg.HandoffLogBytesMax = int(seed%3) * 32 // 0: rounds go on until the log is empty or RoundsMax
		r := newInProcess(t, seed, 300, cfg)
		r.rejoin(t, seed, 5000, nil)
		// Live: both replicas execute the same feed and stay equal.
		for i := 0; i < 200; i++ {
			r.feed(true)
			if i%20 == 19 {
				drainExec(r.src)
				drainExec(r.dst)
				if r.src.LastExecuted() != r.dst.LastExecuted() {
					t.Fatalf("seed %d: source at %v, destination at %v", seed, r.src.LastExecuted(), r.dst.LastExecuted())
				}
				if a, b := r.src.Partition().Digest(), r.dst.Partition().Digest(); a != b {
					t.Fatalf("seed %d: after handoff, digests differ at %v: %x vs %x", seed, r.src.LastExecuted(), a, b)
				}
			}
		}
		m := r.source.Metrics()
		if m.Snapshot.Rows == 0 {
			t.Fatalf("seed %d: no snapshot rows streamed", seed)
		}
		if m.Rounds > 1 {
			multiRound++
		}
		if m.Deletes.Rows > 0 && m.Upserts.Rows > 0 {
			withDeltas++
		}
		if r.dest.Metrics().TxnsDropped > 0 {
			withDropped++
		}
	}
	// The runs must cover what they claim to: writes behind the cursor
	// shipped in several catch-up rounds, and buffered txns below E
	// dropped at handoff.
	if multiRound < 10 || withDeltas < 10 || withDropped < 10 {
		t.Fatalf("of 40 seeds: %d with several rounds, %d with deletes and upserts, %d dropping buffered txns; want >= 10 each", multiRound, withDeltas, withDropped)
	}
}

// TestRejoinHeartbeatsOnly: with no client traffic at all, the handshake
// still completes and the rejoin ends live.
func TestRejoinHeartbeatsOnly(t *testing.T) {
	cfg := DefaultSourceConfig(wire.MsgHeader{})
	cfg.Stream.BlockBytesMax = 1024
	r := newInProcess(t, 1, 200, cfg)
	for i := 0; i < 2000 && !r.dest.State().Final(); i++ {
		g := r.gens[i%2]
		r.now++
		id := g.Next()
		if err := r.src.Heartbeat(id); err != nil {
			t.Fatal(err)
		}
		if err := r.dest.OnHeartbeat(id); err != nil {
			t.Fatal(err)
		}
		r.stepSource(1)
		r.source.Tick()
		r.dest.Tick()
		r.exchange()
	}
	if r.dest.State() != StateLive {
		t.Fatalf("destination %s: %v", r.dest.State(), r.dest.Err())
	}
	if r.src.Partition().Digest() != r.dst.Partition().Digest() {
		t.Fatal("digests differ")
	}
}

// TestRejoinAbortsCleanly aborts at each phase and checks both sides: the
// destination empty and held, the source with no stream or gate left
// (its later writes are not logged and not held).
func TestRejoinAbortsCleanly(t *testing.T) {
	for _, at := range []State{StateBuffering, StateProposing, StateStreaming, StateCatchingUp} {
		cfg := DefaultSourceConfig(wire.MsgHeader{})
		cfg.Stream.BlockBytesMax = 128
		cfg.WindowBlocksMax = 1
		r := newInProcess(t, 5, 300, cfg)
		reached := func() bool { return r.dest.State() == at }
		for i := 0; i < 5000 && !reached(); i++ {
			r.feed(true)
			r.stepSource(1)
			r.exchangeUntil(reached)
		}
		if r.dest.State() != at {
			t.Fatalf("never reached %s (at %s)", at, r.dest.State())
		}
		r.dest.Abort(wire.AbortNodeFailed, "a node of the partition failed")
		r.exchange()
		if r.dest.State() != StateAborted || r.source.State() != StateAborted {
			t.Fatalf("abort at %s: destination %s, source %s", at, r.dest.State(), r.source.State())
		}
		if n := r.dst.Partition().Tables()[0].Len(); n != 0 {
			t.Fatalf("abort at %s: destination keeps %d rows", at, n)
		}
		if _, ok := r.dst.Step(); ok {
			t.Fatalf("abort at %s: the aborted destination executed a txn", at)
		}
		// The source runs freely again.
		for i := 0; i < 50; i++ {
			r.feed(false)
		}
		r.now += 100
		for _, g := range r.gens {
			if err := r.src.Heartbeat(g.Next()); err != nil {
				t.Fatal(err)
			}
		}
		r.stepSource(1000)
		if r.src.Queued() != 0 {
			t.Fatalf("abort at %s: source still holds %d txns", at, r.src.Queued())
		}
	}
}

// TestRejoinDigestMismatchFails corrupts one row in transit, keeping the
// block valid: the destination must refuse to go live.
func TestRejoinDigestMismatchFails(t *testing.T) {
	cfg := DefaultSourceConfig(wire.MsgHeader{})
	cfg.Stream.BlockBytesMax = 512
	r := newInProcess(t, 3, 100, cfg)
	corrupted := false
	for i := 0; i < 5000 && !(r.dest.State().Final() && r.source.State().Final()); i++ {
		r.feed(true)
		r.stepSource(1)
		if !corrupted {
			for _, m := range r.source.Outbox() {
				if b, ok := m.(*wire.Block); ok && b.Kind == wire.BlockSnapshot && !corrupted {
					// A kv tuple ends with its int64 column n, here a
					// positive fixint below 100: flipping its low bit keeps
					// the tuple valid and changes the row.
					b.Tuples[len(b.Tuples)-1] ^= 0x01
					corrupted = true
				}
				r.toDest = append(r.toDest, m)
			}
		}
		r.exchange()
		r.source.Tick()
		r.dest.Tick()
	}
	if !corrupted {
		t.Fatal("no snapshot block to corrupt")
	}
	var ae *AbortError
	if r.dest.State() != StateAborted || !errors.As(r.dest.Err(), &ae) || ae.Reason != wire.AbortDigestMismatch {
		t.Fatalf("destination %s with %v; want aborted for a digest mismatch", r.dest.State(), r.dest.Err())
	}
	if r.dst.Partition().Tables()[0].Len() != 0 {
		t.Fatal("destination kept rows after a digest mismatch")
	}
	// The source hears of it: the attempt failed, it is not done.
	if r.source.State() != StateAborted || !errors.As(r.source.Err(), &ae) || ae.Reason != wire.AbortDigestMismatch || !ae.Remote {
		t.Fatalf("source %s with %v; want aborted by the destination's digest mismatch", r.source.State(), r.source.Err())
	}
}

// TestHandoffLostAborts loses the Handoff on its way: the destination
// never goes live and heartbeats on. The source must not count the
// attempt done: with no HandoffAck it aborts after its stall window,
// whatever the destination's heartbeats, and the destination follows.
func TestHandoffLostAborts(t *testing.T) {
	cfg := DefaultSourceConfig(wire.MsgHeader{})
	cfg.Stream.BlockBytesMax = 512
	cfg.StallTicksMax = 60
	r := newInProcess(t, 3, 100, cfg)
	lost, lostAt := false, 0
	for i := 0; i < 5000 && !(r.dest.State().Final() && r.source.State().Final()); i++ {
		r.feed(true)
		r.stepSource(1)
		for _, m := range r.source.Outbox() {
			if _, ok := m.(*wire.Handoff); ok && !lost {
				lost, lostAt = true, i
				continue
			}
			r.toDest = append(r.toDest, m)
		}
		r.exchange()
		r.source.Tick()
		r.dest.Tick()
		if lost && r.source.State() == StateDone {
			t.Fatalf("source done at step %d with its handoff lost", i)
		}
	}
	if !lost {
		t.Fatal("no handoff to lose")
	}
	var ae *AbortError
	if r.source.State() != StateAborted || !errors.As(r.source.Err(), &ae) || ae.Reason != wire.AbortTimeout {
		t.Fatalf("source %s with %v; want aborted by its stall timeout", r.source.State(), r.source.Err())
	}
	if r.dest.State() != StateAborted || r.dst.Partition().Tables()[0].Len() != 0 {
		t.Fatalf("destination %s with %d rows; want aborted and empty", r.dest.State(), r.dst.Partition().Tables()[0].Len())
	}
	t.Logf("handoff lost at step %d; %v", lostAt, r.source.Err())
}

// TestHandoffAckChecked: the source is done only by a HandoffAck naming
// the E and the digest it handed off; another digest fails the attempt.
func TestHandoffAckChecked(t *testing.T) {
	for _, bad := range []bool{false, true} {
		cfg := DefaultSourceConfig(wire.MsgHeader{})
		cfg.Stream.BlockBytesMax = 512
		r := newInProcess(t, 4, 100, cfg)
		live := func() bool { return r.dest.State() == StateLive }
		for i := 0; i < 5000 && !live(); i++ {
			r.feed(true)
			r.stepSource(1)
			r.exchangeUntil(live)
		}
		// exchangeUntil stops with the destination's last messages still
		// in its outbox: the ack is held back.
		var ack *wire.HandoffAck
		for _, m := range r.dest.Outbox() {
			if a, ok := m.(*wire.HandoffAck); ok {
				ack = a
				continue
			}
			r.toSource = append(r.toSource, m)
		}
		if ack == nil || r.dest.State() != StateLive {
			t.Fatalf("destination %s, no HandoffAck", r.dest.State())
		}
		for len(r.toSource) > 0 {
			m := r.toSource[0]
			r.toSource = r.toSource[1:]
			_ = r.source.OnMessage(m)
		}
		if st := r.source.State(); st != StateHandingOff || !r.source.HandoffSent() {
			t.Fatalf("source %s before the ack (handoff sent %v); want handing-off", st, r.source.HandoffSent())
		}
		if bad {
			ack.Digest ^= 1
		}
		err := r.source.OnMessage(ack)
		var ae *AbortError
		switch {
		case !bad && (err != nil || r.source.State() != StateDone):
			t.Fatalf("good ack: source %s, %v", r.source.State(), err)
		case bad && (r.source.State() != StateAborted || !errors.As(err, &ae) || ae.Reason != wire.AbortDigestMismatch):
			t.Fatalf("ack with another digest: source %s, %v; want aborted for a digest mismatch", r.source.State(), err)
		}
	}
}

// TestEpochFencing: a message of a lower epoch is rejected and counted and
// changes nothing; a higher one means this attempt is superseded.
func TestEpochFencing(t *testing.T) {
	cfg := DefaultSourceConfig(wire.MsgHeader{})
	r := newInProcess(t, 4, 10, cfg)
	stale := &wire.Propose{MsgHeader: wire.MsgHeader{Epoch: 6, Partition: 3}, TxnID: 1}
	if err := r.source.OnMessage(stale); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("stale proposal: %v, want ErrStaleEpoch", err)
	}
	if r.source.State() != StateAnswering || r.source.Metrics().StaleRejected != 1 || len(r.source.Outbox()) != 0 {
		t.Fatalf("stale proposal changed the source: %s, %+v", r.source.State(), r.source.Metrics())
	}
	if err := r.dest.OnMessage(&wire.Answer{MsgHeader: wire.MsgHeader{Epoch: 1, Partition: 3}, TxnID: 5}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("stale answer: %v, want ErrStaleEpoch", err)
	}
	if err := r.dest.OnMessage(&wire.Heartbeat{MsgHeader: wire.MsgHeader{Epoch: 7, Partition: 4}}); !errors.Is(err, ErrWrongPartition) {
		t.Fatalf("other partition: %v, want ErrWrongPartition", err)
	}
	if r.dest.State() != StateBuffering || r.dest.Metrics().StaleRejected != 1 {
		t.Fatalf("stale answer changed the destination: %s", r.dest.State())
	}
	_ = r.source.OnMessage(&wire.Heartbeat{MsgHeader: wire.MsgHeader{Epoch: 8, Partition: 3}})
	var ae *AbortError
	if r.source.State() != StateAborted || !errors.As(r.source.Err(), &ae) || ae.Reason != wire.AbortStaleEpoch {
		t.Fatalf("newer epoch: source %s, %v; want aborted as superseded", r.source.State(), r.source.Err())
	}
}

// TestRejoinFeedLagsTheStream: the destination's copy of the feed arrives
// late, so txns below E reach it after it went live. Their effect came
// with the snapshot: they are taken as heartbeats, and the replicas stay
// equal.
func TestRejoinFeedLagsTheStream(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		cfg := DefaultSourceConfig(wire.MsgHeader{})
		cfg.Stream.BlockBytesMax = 256
		r := newInProcess(t, seed, 200, cfg)
		var lagged []partition.Invocation
		for i := 0; i < 5000 && !r.dest.State().Final(); i++ {
			// Once streaming, the destination's feed falls behind.
			if r.dest.State() == StateStreaming || r.dest.State() == StateCatchingUp || len(lagged) > 0 {
				lagged = append(lagged, r.feedOne(false))
			} else {
				r.feed(true)
			}
			r.stepSource(r.rng.IntN(3))
			r.source.Tick()
			r.dest.Tick()
			r.exchange()
		}
		if r.dest.State() != StateLive {
			t.Fatalf("seed %d: destination %s: %v", seed, r.dest.State(), r.dest.Err())
		}
		for _, inv := range lagged {
			var err error
			if inv.Proc == "" {
				err = r.dest.OnHeartbeat(inv.ID)
			} else {
				err = r.dest.OnTxn(inv)
			}
			if err != nil {
				t.Fatalf("seed %d: lagged %v: %v", seed, inv.ID, err)
			}
		}
		if r.dest.Metrics().TxnsLate == 0 {
			t.Fatalf("seed %d: no txn arrived late; the test lost its point", seed)
		}
		for i := 0; i < 50; i++ {
			r.feed(true)
		}
		r.settleAndCompare(seed)
	}
}

// TestRejoinResumesAfterDrops drops the connection at random moments:
// everything in flight both ways is lost, and both sides Resume on the new
// one. The rejoin must end live with equal digests, without an abort, and
// each resume may send again at most one window of blocks.
func TestRejoinResumesAfterDrops(t *testing.T) {
	statesSeen := map[State]bool{}
	for seed := uint64(1); seed <= 40; seed++ {
		cfg := DefaultSourceConfig(wire.MsgHeader{})
		cfg.Stream.BlockBytesMax = 1 << (6 + seed%6)
		cfg.WindowBlocksMax = 1 + int(seed%5)
		cfg.HandoffLogBytesMax = 32
		r := newInProcess(t, seed, 200, cfg)
		drops := 0
		// Drops go on after the destination is live: the HandoffAck may
		// be lost too, and is sent again by Resume.
		for i := 0; i < 20000 && !(r.dest.State() == StateLive && r.source.State() == StateDone); i++ {
			r.feed(true)
			r.stepSource(r.rng.IntN(3))
			if i%3 == 0 {
				r.source.Tick()
				r.dest.Tick()
			}
			// Proposing lasts one exchange: on a quarter of the seeds the
			// connection drops with the proposal in flight.
			forced := seed%4 == 0 && r.dest.State() == StateProposing && !statesSeen[StateProposing]
			if !forced {
				r.exchange()
			}
			if forced || (r.rng.IntN(15) == 0 && drops < 8) {
				drops++
				statesSeen[r.dest.State()] = true
				r.toDest, r.toSource = nil, nil
				_, _ = r.source.Outbox(), r.dest.Outbox()
				before := r.source.Metrics().BlocksResent
				r.source.Resume()
				r.dest.Resume()
				if n := r.source.Metrics().BlocksResent - before; n > int64(cfg.WindowBlocksMax) {
					t.Fatalf("seed %d: one resume sent %d blocks again, window %d", seed, n, cfg.WindowBlocksMax)
				}
			}
		}
		if r.dest.State() != StateLive || r.source.State() != StateDone {
			t.Fatalf("seed %d after %d drops: destination %s (%v), source %s (%v)", seed, drops, r.dest.State(), r.dest.Err(), r.source.State(), r.source.Err())
		}
		for i := 0; i < 30; i++ {
			r.feed(true)
		}
		r.settleAndCompare(seed)
	}
	for _, st := range []State{StateProposing, StateStreaming, StateCatchingUp, StateLive} {
		if !statesSeen[st] {
			t.Errorf("no drop happened with the destination %s; seen %v", st, statesSeen)
		}
	}
}

// settleAndCompare sends a heartbeat from every initiator past everything
// sent, lets both replicas execute all they hold, and requires them at the
// same txn with the same digest.
func (r *inProcess) settleAndCompare(seed uint64) {
	r.t.Helper()
	r.now += 100
	for _, g := range r.gens {
		id := g.Next()
		if err := r.src.Heartbeat(id); err != nil {
			r.t.Fatal(err)
		}
		if err := r.dest.OnHeartbeat(id); err != nil {
			r.t.Fatal(err)
		}
	}
	drainExec(r.src)
	drainExec(r.dst)
	if r.src.LastExecuted() != r.dst.LastExecuted() || r.src.Partition().Digest() != r.dst.Partition().Digest() {
		r.t.Fatalf("seed %d: source at %v digest %x, destination at %v digest %x", seed,
			r.src.LastExecuted(), r.src.Partition().Digest(), r.dst.LastExecuted(), r.dst.Partition().Digest())
	}
}

// TestDestinationLateInitiator: a destination goes live at E only if it
// holds every txn >= E of the initiators it hears and of those the
// Handoff names; otherwise it aborts (uncovered), so a new attempt hears
// the late initiator from its start (docs/DESIGN.md "Feeds that open
// late").
func TestDestinationLateInitiator(t *testing.T) {
	h := wire.MsgHeader{Epoch: 1, Partition: 3}
	id := func(ms int64, in txnid.Initiator) txnid.ID { return txnid.Make(ms, 0, in) }
	// streaming returns a destination that heard initiator 1 at 100 and
	// agreed on S = 100.
	streaming := func() *Destination {
		d, err := NewDestination(newReplica(t, []txnid.Initiator{1}), DestinationConfig{Header: h, Initiators: []txnid.Initiator{1}, StallTicksMax: 50, HeartbeatTicks: 5})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.OnHeartbeat(id(100, 1)); err != nil {
			t.Fatal(err)
		}
		if err := d.OnMessage(&wire.Answer{MsgHeader: h, TxnID: id(100, 1)}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	handoff := func(e txnid.ID, ins ...txnid.Initiator) *wire.Handoff {
		return &wire.Handoff{MsgHeader: h, TxnID: e, Initiators: ins} // an empty partition
	}
	uncovered := func(d *Destination, what string) {
		t.Helper()
		var ae *AbortError
		if d.State() != StateAborted || !errors.As(d.Err(), &ae) || ae.Reason != wire.AbortUncovered || !strings.Contains(ae.Text, "initiator 2") {
			t.Fatalf("%s: destination %s with %v; want aborted, uncovered", what, d.State(), d.Err())
		}
	}

	// Initiator 2's feed opens after the proposal; it is first heard
	// above E.
	d := streaming()
	d.AddInitiator(2)
	if err := d.OnHeartbeat(id(120, 2)); err != nil {
		t.Fatal(err)
	}
	if err := d.OnMessage(handoff(id(110, 1), 1, 2)); err == nil {
		t.Fatal("handoff below the late initiator's first ID taken")
	}
	uncovered(d, "late initiator heard above E")

	// The source runs initiator 2's txns; this side never heard it.
	d = streaming()
	if err := d.OnMessage(handoff(id(110, 1), 1, 2)); err == nil {
		t.Fatal("handoff naming an initiator never heard taken")
	}
	uncovered(d, "initiator never heard")

	// Heard at or below E: live.
	d = streaming()
	d.AddInitiator(2)
	if err := d.OnHeartbeat(id(105, 2)); err != nil {
		t.Fatal(err)
	}
	if err := d.OnMessage(handoff(id(110, 1), 1, 2)); err != nil || d.State() != StateLive {
		t.Fatalf("late initiator heard below E: %v, %s; want live", err, d.State())
	}
	// Live, a newcomer is tracked by the executor alone.
	d.AddInitiator(3)
	if err := d.OnHeartbeat(id(130, 3)); err != nil {
		t.Fatalf("heartbeat of an initiator added once live: %v", err)
	}
}

// A pump cuts at most PumpBlocksMax blocks, and says so (Pending) while
// the window has room, so a driver that pumps again while Pending fills
// the window one block a call, with txns free to run between the calls.
func TestPumpBlocksMax(t *testing.T) {
	cfg := DefaultSourceConfig(wire.MsgHeader{})
	cfg.Stream.BlockBytesMax = 64
	cfg.WindowBlocksMax = 8
	cfg.PumpBlocksMax = 1
	r := newInProcess(t, 7, 300, cfg)
	for i := 0; i < 1000 && r.source.State() != StateStreaming; i++ {
		r.feed(true)
		r.stepSource(0)
		r.exchange()
	}
	if r.source.State() != StateStreaming {
		t.Fatalf("source %s, want streaming", r.source.State())
	}
	r.toDest = append(r.toDest, r.source.Outbox()...)
	if r.source.sent-r.source.acked >= uint64(cfg.WindowBlocksMax) {
		t.Fatalf("%d blocks sent, %d acked on reaching streaming, by pumps of at most %d blocks each: want room left in the window of %d", r.source.sent, r.source.acked, cfg.PumpBlocksMax, cfg.WindowBlocksMax)
	}
	pumps := 0
	for r.source.Pending() {
		if pumps++; pumps > 100 {
			t.Fatal("still pending after 100 pumps")
		}
		r.source.Pump()
		blocks := 0
		for _, m := range r.source.Outbox() {
			if _, ok := m.(*wire.Block); ok {
				blocks++
			}
		}
		if blocks > cfg.PumpBlocksMax {
			t.Fatalf("pump %d cut %d blocks, want at most %d", pumps, blocks, cfg.PumpBlocksMax)
		}
	}
	if got := r.source.sent - r.source.acked; got != uint64(cfg.WindowBlocksMax) {
		t.Fatalf("after %d pumps while pending: %d blocks in flight, want the window's %d", pumps, got, cfg.WindowBlocksMax)
	}
	if pumps < 2 {
		t.Fatalf("%d pumps while pending filled the window: nothing was held back", pumps)
	}
}

// The pump's bound gives way to txns, so it does not hold where no txn can
// run: from the final delta to the handoff the whole delta is cut in one
// pump (the window permitting), and the handoff's pause does not wait for
// the driver's loop between blocks.
func TestPumpBlocksMaxNotInHandoff(t *testing.T) {
	multi := 0
	for seed := uint64(1); seed <= 40; seed++ {
		cfg := DefaultSourceConfig(wire.MsgHeader{})
		cfg.Stream.BlockBytesMax = 64
		cfg.WindowBlocksMax = 4096 // the delta is cut by the pump, not held by the window
		cfg.PumpBlocksMax = 1
		// The handoff straight after the snapshot: its delta is every
		// row written meanwhile, many blocks of 64 B.
		cfg.HandoffLogBytesMax = 1 << 20
		cfg.RoundsMax = 1
		r := newInProcess(t, seed, 300, cfg)
		var atFinal uint64
		r.rejoin(t, seed, 20000, func() {
			if r.source.final && atFinal == 0 {
				atFinal = r.source.sent
			}
			if r.source.final && r.source.Pending() {
				t.Fatalf("seed %d: a pump in the final delta stopped at PumpBlocksMax", seed)
			}
		})
		// The pump that began the final delta cut on to the handoff:
		// blocks were cut after the delta began and in that pump.
		if r.source.handoff.LastSeq >= atFinal && r.source.Metrics().Upserts.Rows > 1 {
			multi++
		}
	}
	if multi < 5 {
		t.Fatalf("%d of 40 seeds with a final delta of several blocks, want >= 5", multi)
	}
}
