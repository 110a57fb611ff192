package recovery_test

// How another store rejoins through the Source and Destination
// processors: it implements the store seams (SourceStore,
// DestinationStore, TableStream; docs/DESIGN.md "Store seams"), and a
// driver of its own feeds both processors and carries their messages.
// This one is a map from key to value that only puts, driven on one
// goroutine with messages handed over in memory; mapstore_test.go has a
// fuller one (deletes, a throttle, dropped connections, aborts).

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"

	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The seams kvStore fills: one type serves both sides here, as
// recovery.PartitionStore does.
var (
	_ recovery.SourceStore      = (*kvStore)(nil)
	_ recovery.DestinationStore = (*kvStore)(nil)
	_ recovery.TableStream      = (*kvStream)(nil)
)

// kvTypes are the types of a put's params and of a block's tuples: key,
// value.
var kvTypes = []wire.Type{wire.TypeBytes, wire.TypeBytes}

// kvStore is one replica: its rows, and the txns the feed delivered, run
// one at a time in ID order once no initiator can send a smaller one (the
// Tracker's safe ID). The processors call it only between two txns.
type kvStore struct {
	rows    map[string]string
	tracker *txnid.Tracker
	queue   []partition.Invocation // unexecuted, smallest ID first, all above last
	last    txnid.ID
	gate    partition.Gate
	stream  *kvStream // while a Source streams from it: told every change
}

func newKVStore(initiators ...txnid.Initiator) *kvStore {
	s := &kvStore{rows: map[string]string{}, tracker: txnid.NewTracker()}
	for _, in := range initiators {
		s.tracker.Add(in)
	}
	return s
}

func (s *kvStore) put(k, v string) {
	s.rows[k] = v
	if s.stream != nil {
		s.stream.changed[k] = true
	}
}

// step runs the next txn if it is ready and the gate lets it: the gate is
// how the Source activates its stream exactly at S and holds the handoff.
func (s *kvStore) step() bool {
	next, ok := s.Ready()
	if !ok || (s.gate != nil && !s.gate.BeforeTxn(next)) {
		return false
	}
	inv := s.queue[0]
	s.queue, s.last = s.queue[1:], inv.ID
	kv, _, err := wire.DecodeTuple(inv.Params, kvTypes, nil)
	if err != nil {
		panic(err) // the example's own feed encoded it
	}
	s.put(string(kv[0].Bytes), string(kv[1].Bytes))
	return true
}

// SourceView: where the handshake's S falls in this store's txn order.

func (s *kvStore) QueuedFrom(p txnid.ID) (txnid.ID, bool) {
	i, _ := slices.BinarySearchFunc(s.queue, p, byID)
	if i == len(s.queue) {
		return 0, false
	}
	return s.queue[i].ID, true
}

func (s *kvStore) Safe() (txnid.ID, bool) { return s.tracker.Safe() }
func (s *kvStore) LastExecuted() txnid.ID { return s.last }

func (s *kvStore) Ready() (txnid.ID, bool) {
	safe, ok := s.tracker.Safe()
	if len(s.queue) == 0 || !ok || s.queue[0].ID > safe {
		return 0, false
	}
	return s.queue[0].ID, true
}

func byID(inv partition.Invocation, id txnid.ID) int { return cmp.Compare(inv.ID, id) }

// SourceStore and DestinationStore, shared.

func (s *kvStore) Initiators() []txnid.Initiator { return s.tracker.Initiators() }
func (s *kvStore) SetGate(g partition.Gate)      { s.gate = g }
func (s *kvStore) Rows() uint64                  { return uint64(len(s.rows)) }

// Digest must not depend on the order the rows came in: a sum of row
// hashes. Both sides compute it the same way; the handoff compares them.
func (s *kvStore) Digest() uint64 {
	var d uint64
	for k, v := range s.rows {
		h := fnv.New64a()
		_, _ = fmt.Fprintf(h, "%d:%s=%s", len(k), k, v)
		d += h.Sum64()
	}
	return d
}

// Activate starts the stream at S: the snapshot is the keys held now.
func (s *kvStore) Activate(cfg cow.Config) (recovery.TableStream, error) {
	if s.stream != nil {
		return nil, errors.New("kvstore: a stream is active")
	}
	s.stream = &kvStream{s: s, cfg: cfg, todo: slices.Sorted(maps.Keys(s.rows)), snapshot: true, changed: map[string]bool{}}
	return s.stream, nil
}

// DestinationStore: the queue the feed fills while the rows are rebuilt.

func (s *kvStore) Offer(inv partition.Invocation) error {
	if inv.ID <= s.last {
		return fmt.Errorf("kvstore: txn %v at or below %v", inv.ID, s.last)
	}
	if err := s.tracker.Observe(inv.ID.Initiator(), inv.ID); err != nil {
		return err
	}
	i, _ := slices.BinarySearchFunc(s.queue, inv.ID, byID)
	s.queue = slices.Insert(s.queue, i, inv)
	return nil
}

func (s *kvStore) Heartbeat(id txnid.ID) error        { return s.tracker.Observe(id.Initiator(), id) }
func (s *kvStore) AddInitiator(in txnid.Initiator)    { s.tracker.Add(in) }
func (s *kvStore) RemoveInitiator(in txnid.Initiator) { s.tracker.Remove(in) }
func (s *kvStore) Clear()                             { clear(s.rows) }
func (s *kvStore) Reserve(uint64)                     {} // a hint; a map may ignore it

// ResetTo: the rows are now the state after every txn < e, so the queued
// txns below e are dropped, and the queue continues at e.
func (s *kvStore) ResetTo(e txnid.ID) int {
	n := 0
	for len(s.queue) > 0 && s.queue[0].ID < e {
		s.queue, n = s.queue[1:], n+1
	}
	s.last = max(s.last, e-1)
	return n
}

// Apply decodes the whole block before it writes any of it (all or
// nothing), and a put is idempotent, so a block applied twice is harmless.
func (s *kvStore) Apply(b cow.Block) error {
	n, pos, err := wire.ReadArrayHeader(b.Tuples)
	if err != nil || n != int(b.Count) || b.Kind == wire.BlockDeletes {
		return fmt.Errorf("kvstore: bad %v block of %d tuples", b.Kind, b.Count)
	}
	var rows [][]wire.Value
	for range n {
		kv, l, err := wire.DecodeTuple(b.Tuples[pos:], kvTypes, nil)
		if err != nil {
			return err
		}
		rows, pos = append(rows, kv), pos+l
	}
	for _, kv := range rows {
		s.put(string(kv[0].Bytes), string(kv[1].Bytes))
	}
	return nil
}

// kvStream is the store's TableStream. Its invariant: a key whose value
// may differ from what the blocks cut so far sent is in todo (the part in
// flight reads it when cut) or in changed (the next round sends it). Every
// change is logged, even one still ahead in todo: sending a row twice is
// harmless, missing one is not.
type kvStream struct {
	s        *kvStore
	cfg      cow.Config
	todo     []string // the keys of the part in flight not cut yet
	snapshot bool     // the part in flight is the snapshot
	changed  map[string]bool
}

// NextBlock cuts rows, read as they are now, until the block reaches
// BlockBytesMax (one row at least).
func (st *kvStream) NextBlock(dst []byte) (cow.Block, bool) {
	var tuples []byte
	n := 0
	for ; len(st.todo) > 0 && (n == 0 || len(tuples) < st.cfg.BlockBytesMax); n++ {
		k := st.todo[0]
		st.todo = st.todo[1:]
		tuples, _ = wire.NewTupleEncoder().AppendTuple(tuples, []wire.Value{wire.Bytes([]byte(k)), wire.Bytes([]byte(st.s.rows[k]))})
	}
	if n == 0 {
		return cow.Block{}, false // this part is all cut
	}
	kind := wire.BlockUpserts
	if st.snapshot {
		kind = wire.BlockSnapshot
	}
	return cow.Block{Kind: kind, Table: 1, Count: uint32(n), Tuples: append(wire.AppendArrayHeader(dst, n), tuples...)}, true
}

// StartRound makes what changed since the last part the next one.
func (st *kvStream) StartRound() error {
	st.todo, st.snapshot = slices.Sorted(maps.Keys(st.changed)), false
	clear(st.changed)
	return nil
}

// FinalDelta is the last round; the Source runs no txn from now to the
// handoff, so nothing changes behind it.
func (st *kvStream) FinalDelta() error { return st.StartRound() }

func (st *kvStream) LogBytes() int {
	n := 0
	for k := range st.changed {
		n += len(k)
	}
	for _, k := range st.todo {
		n += len(k)
	}
	return n
}

// No throttle: a store whose writes can outrun the stream holds txns here
// while its log is over cfg.ChangeLogBytesMax (cow's does).
func (st *kvStream) BeforeTxn(txnid.ID) bool { return true }
func (st *kvStream) Tick()                   {}
func (st *kvStream) Deactivate()             { st.s.stream = nil }

func kvPut(id txnid.ID, k, v string) partition.Invocation {
	params, _ := wire.NewTupleEncoder().AppendTuple(nil, []wire.Value{wire.Bytes([]byte(k)), wire.Bytes([]byte(v))})
	return partition.Invocation{ID: id, Proc: "put", Params: params}
}

// Example_embedding rebuilds a replica of the kvStore from a live one that
// keeps taking writes, through the same processors the node runs.
func Example_embedding() {
	// One initiator issues the txn IDs; a fixed clock makes the run
	// deterministic.
	const in txnid.Initiator = 1
	gen, err := txnid.NewGenerator(in, func() int64 { return txnid.EpochUnixMillis + 1000 })
	if err != nil {
		panic(err)
	}
	src := newKVStore(in)
	for i := range 8 {
		src.put(fmt.Sprintf("k%d", i), "old")
	}
	dst := newKVStore(in) // the driver adds the initiators before the attempt

	// Both sides of one attempt: its epoch fences off older attempts'
	// messages. Small blocks under a window of one, so the stream takes
	// several steps, writes land between its blocks, and the catch-up
	// rounds have something to send.
	h := wire.MsgHeader{Epoch: 1, Partition: 0}
	cfg := recovery.DefaultSourceConfig(h)
	cfg.Stream.BlockBytesMax = 16
	cfg.WindowBlocksMax = 1
	cfg.HandoffLogBytesMax = 0
	source, err := recovery.NewSourceOn(src, cfg)
	if err != nil {
		panic(err)
	}
	dest, err := recovery.NewDestinationOn(dst, recovery.DestinationConfig{Header: h, Initiators: []txnid.Initiator{in}, StallTicksMax: 100, HeartbeatTicks: 10})
	if err != nil {
		panic(err)
	}

	// The driver, one step a tick: the feed goes to both replicas (the
	// destination buffers it until live), each store runs what its gate
	// lets it, the source is pumped after every txn, and each side's
	// Outbox goes to the other's OnMessage, one hop a step, until both
	// sides end. Over a network, a recovery.Conn carries the messages
	// (stream.Conn on TCP).
	during := 0 // writes the source ran while it streamed
	ended := func() bool { return source.State().Final() && dest.State().Final() }
	for step := 0; step < 30 || !ended() && step < 1000; step++ {
		id := gen.Next()
		if step < 30 { // writes, then heartbeats only
			inv := kvPut(id, fmt.Sprintf("k%d", step%12), fmt.Sprint("new", step))
			_ = src.Offer(inv)
			_ = dest.OnTxn(inv)
		} else {
			_ = src.Heartbeat(id)
			_ = dest.OnHeartbeat(id)
		}
		for src.step() {
			if st := source.State(); st == recovery.StateStreaming || st == recovery.StateCatchingUp {
				during++
			}
			source.Pump()
		}
		for dst.step() { // held until live
		}
		source.Pump()
		toDest, toSource := source.Outbox(), dest.Outbox()
		for _, m := range toDest {
			_ = dest.OnMessage(m) // a refused message shows in the states
		}
		for _, m := range toSource {
			_ = source.OnMessage(m)
			source.Pump()
		}
		source.Tick()
		dest.Tick()
	}
	m := source.Metrics()
	fmt.Println("source", source.State(), "- destination", dest.State())
	fmt.Println("snapshot rows", m.Snapshot.Rows, "- writes while streaming", during, "- catch-up rounds", m.Rounds)
	// Both ran every txn: the destination its buffer from E on, as the
	// source did after the handoff.
	fmt.Println("rows", dst.Rows(), "- same digest:", dst.Digest() == src.Digest(), "- same rows:", maps.Equal(dst.rows, src.rows))
	// Output:
	// source done - destination live
	// snapshot rows 8 - writes while streaming 29 - catch-up rounds 5
	// rows 12 - same digest: true - same rows: true
}
