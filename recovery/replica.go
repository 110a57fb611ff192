package recovery

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// ReplicaState is where one partition replica stands in its lifecycle. It
// is one enum with a table of legal moves (replicaMoves), checked on every
// move:
//
//	              start-destination              destination live
//	needs-rejoin ───────────────────► rejoining ──────────────────► live
//	   ▲  ▲                               │                       │  ▲
//	   │  └───────────────────────────────┴───────────────────────┘  │
//	   │         attempt ended, superseded, or the replica failed    │
//	   │                                              lost alone │  │ loss
//	   └────────────── failed, or a rejoin starts ─────── held ◄──┘  │ accepted
//	                                                          └──────┘
//
// A replica starts live (it holds its partition) or needs-rejoin. A source
// attempt is served only while live and does not change the state; the
// replica failing ends it. A live replica that may lack txns of its
// partition, with no other replica live to rebuild it from, is held
// rather than failed (Lose; docs/DESIGN.md "Holding a partition").
//
// It is the one lifecycle every layer speaks: the node's durable record
// stores its number (package nodestate), the placement in etcd and the
// node's /status its name (MarshalText), so a state read anywhere compares
// with these constants and never with a string.
type ReplicaState uint8

// The numbers are stored in every node's data directory; never renumber.
const (
	// ReplicaNeedsRejoin: the replica holds nothing it may execute; its
	// feed is dropped until a destination attempt starts.
	ReplicaNeedsRejoin ReplicaState = 1
	// ReplicaRejoining: a destination attempt rebuilds the replica and
	// buffers its feed.
	ReplicaRejoining ReplicaState = 2
	// ReplicaLive: the replica executes its feed.
	ReplicaLive ReplicaState = 3
	// ReplicaHeld: the replica may lack txns of its partition and no
	// other replica was live to rebuild it from: it keeps its content
	// and executor, takes in and runs nothing, and answers nothing. It
	// ends failed (a live replica to rebuild it from came back, and a
	// rejoin starts) or live again (an admin accepted the loss). Never
	// in etcd's records, where it is needs-rejoin with a reason
	// (supervise.Replica.Held).
	ReplicaHeld ReplicaState = 4
)

var replicaStateNames = [...]string{
	ReplicaNeedsRejoin: "needs-rejoin",
	ReplicaRejoining:   "rejoining",
	ReplicaLive:        "live",
	ReplicaHeld:        "held",
}

func (s ReplicaState) String() string {
	if s.Valid() {
		return replicaStateNames[s]
	}
	return fmt.Sprintf("replica-state(%d)", uint8(s))
}

// Valid reports whether s is one of the states.
func (s ReplicaState) Valid() bool {
	return int(s) < len(replicaStateNames) && replicaStateNames[s] != ""
}

// ErrReplicaState: a replica state's name or number is none of the states.
var ErrReplicaState = errors.New("recovery: unknown replica state")

// MarshalText writes the state's name ("live", "rejoining",
// "needs-rejoin", "held"), as etcd's placement records and /status carry
// it.
func (s ReplicaState) MarshalText() ([]byte, error) {
	if !s.Valid() {
		return nil, fmt.Errorf("%w: %d", ErrReplicaState, uint8(s))
	}
	return []byte(replicaStateNames[s]), nil
}

// UnmarshalText reads a state's name; any other text is ErrReplicaState
// and leaves s as it was.
func (s *ReplicaState) UnmarshalText(text []byte) error {
	for i, name := range replicaStateNames {
		if name != "" && name == string(text) {
			*s = ReplicaState(i)
			return nil
		}
	}
	return fmt.Errorf("%w: %q", ErrReplicaState, text)
}

// replicaMoves is the replica's table of legal moves. Superseding a
// destination attempt passes through needs-rejoin: the old attempt ends
// (its partial replica goes) before the new one starts.
var replicaMoves = map[ReplicaState][]ReplicaState{
	ReplicaNeedsRejoin: {ReplicaRejoining},
	ReplicaRejoining:   {ReplicaLive, ReplicaNeedsRejoin},
	ReplicaLive:        {ReplicaNeedsRejoin, ReplicaHeld},
	ReplicaHeld:        {ReplicaNeedsRejoin, ReplicaLive},
}

// ErrReplica classifies a start or an input the replica refuses (not
// live, a fenced epoch, no such attempt); the driver reports it to whoever
// asked and changes nothing.
var ErrReplica = errors.New("recovery: replica refused")

// ReplicaConfig sets up a Replica.
type ReplicaConfig struct {
	// Partition is the replica's partition.
	Partition uint32
	// Live: the replica starts live, with a fresh executor; else it needs
	// a rejoin.
	Live bool
	// Fence is the highest destination epoch the replica has seen, from
	// its durable record: no destination attempt at or below it starts
	// (docs/DESIGN.md "Incarnations and fencing").
	Fence uint64
	// NewExecutor builds an empty partition with the cluster's tables and
	// an executor over it. The replica adds its initiators.
	NewExecutor func() (*partition.Executor, error)
	// DropResults: keep no Done for Results (a driver that replies to no
	// initiator: the simulator, a benchmark), which saves a copy and an
	// allocation a txn.
	DropResults bool
}

// OutputKind says what an Output is.
type OutputKind uint8

const (
	// OutSourceMessages: Msgs go to the source attempt's peer. State is the
	// source's state once they were produced.
	OutSourceMessages OutputKind = iota + 1
	// OutDestinationMessages: Msgs go to the destination attempt's peer.
	OutDestinationMessages
	// OutSourceEnded: the source attempt of Epoch ended; Err is nil if it
	// is done (the destination acknowledged the handoff). Source is the
	// ended processor, for its metrics.
	OutSourceEnded
	// OutDestinationEnded: the destination attempt of Epoch ended without
	// a live replica (aborted or superseded); Err says why.
	OutDestinationEnded
	// OutLive: the destination attempt of Epoch went live; the replica
	// executes from its E on.
	OutLive
	// OutFailed: the replica dropped its content and needs a rejoin; Why
	// says why.
	OutFailed
	// OutHeld: the replica is held (Lose); Why says why.
	OutHeld
	// OutLossAccepted: the held replica is live again at its last txn
	// (AcceptLoss).
	OutLossAccepted
)

// Output is one thing the driver must do, in order: send, report, record.
type Output struct {
	Kind OutputKind
	// Epoch names the attempt (0 for OutFailed).
	Epoch uint64
	// Msgs are the messages for the attempt's peer, in order.
	Msgs []wire.Message
	// State is the attempt's state once the output was produced: the
	// driver's lease guard holds back messages of a running source only.
	State State
	// Err is why an attempt ended (nil: a source done); Why why the
	// replica failed.
	Err error
	Why string
	// Source and Destination are the ended or live attempt's processor,
	// for its metrics.
	Source      *Source
	Destination *Destination
}

// Replica is one partition replica's protocol core, modelled on raft's
// RawNode: no goroutines, no clock, no I/O. A driver feeds it the
// partition's feed (OnTxn, OnHeartbeat, AddInitiator, RemoveInitiator),
// its attempts' messages, ticks and starts, runs it (Step), and takes what
// it produced: Done results for the initiators (Results) and messages,
// endings and state changes (Outbox). Every decision about the replica is
// here; the driver owns the connections, the timers and the records.
//
// Invariants: exec is nil unless the state is live or held (it is the
// destination's executor once that went live); dst is set while
// rejoining, and may stay, live, as the router of the feed after the
// handoff; a source attempt runs only on a live replica; fence only grows,
// and no destination attempt at or below it starts.
type Replica struct {
	p     uint32
	state ReplicaState
	// exec runs the feed while live; nil otherwise.
	exec    *partition.Executor
	newExec func() (*partition.Executor, error)
	// initiators are those heard from on a feed, added to every new
	// executor and destination attempt.
	initiators  map[txnid.Initiator]bool
	fence       uint64
	dropResults bool

	src     *Source
	srcPeer string
	srcEp   uint64

	dst     *Destination
	dstExec *partition.Executor
	dstPeer string
	dstEp   uint64
	// dstLive: dst went live; it routes the feed to exec and sends nothing
	// more.
	dstLive bool

	out     []Output
	results []*wire.Done
	// heldWhy says why the replica is held; empty unless it is.
	heldWhy string
}

// NewReplica builds a replica core.
func NewReplica(cfg ReplicaConfig) (*Replica, error) {
	if cfg.NewExecutor == nil {
		return nil, fmt.Errorf("%w: no NewExecutor", ErrConfig)
	}
	r := &Replica{p: cfg.Partition, state: ReplicaNeedsRejoin, newExec: cfg.NewExecutor,
		initiators: map[txnid.Initiator]bool{}, fence: cfg.Fence, dropResults: cfg.DropResults}
	if cfg.Live {
		exec, err := r.newExecutor()
		if err != nil {
			return nil, err
		}
		r.exec, r.state = exec, ReplicaLive
	}
	return r, nil
}

func (r *Replica) newExecutor() (*partition.Executor, error) {
	exec, err := r.newExec()
	if err != nil {
		return nil, fmt.Errorf("recovery: partition %d: %w", r.p, err)
	}
	for in := range r.initiators {
		exec.AddInitiator(in)
	}
	return exec, nil
}

// move checks and makes a lifecycle move. An illegal one is a bug of this
// file, never an input's doing, so it panics.
func (r *Replica) move(to ReplicaState) {
	if !slices.Contains(replicaMoves[r.state], to) {
		panic(fmt.Sprintf("recovery: replica %d: illegal move %v → %v", r.p, r.state, to))
	}
	r.state = to
}

// State returns the replica's lifecycle state.
func (r *Replica) State() ReplicaState { return r.state }

// Fence returns the highest destination epoch seen.
func (r *Replica) Fence() uint64 { return r.fence }

// Executor returns the executor running the feed, nil unless live.
func (r *Replica) Executor() *partition.Executor { return r.exec }

// Source returns the running source attempt, or nil.
func (r *Replica) Source() *Source { return r.src }

// Destination returns the destination attempt, running or gone live, or
// nil.
func (r *Replica) Destination() *Destination { return r.dst }

// Tracks reports whether the replica waits for in's txns and heartbeats.
func (r *Replica) Tracks(in txnid.Initiator) bool { return r.initiators[in] }

// Initiators returns the initiators heard from, sorted.
func (r *Replica) Initiators() []txnid.Initiator {
	return slices.Sorted(maps.Keys(r.initiators))
}

// Executing reports whether the replica takes in its feed: live, or
// buffering for a destination attempt.
func (r *Replica) Executing() bool {
	return r.state != ReplicaHeld && (r.exec != nil || r.dst != nil)
}

// Held returns why the replica is held, empty unless it is.
func (r *Replica) Held() string { return r.heldWhy }

// JoinFloor is the floor of a feed that opens now: the highest txn ID the
// replica executed, handed off, or read as safe (partition.Executor's
// SafeUpTo), Zero when it has no executor. An initiator that joins sends
// nothing at or below it. What it executed is not enough: a source sets
// its boundary S on the safe point (recovery.Answer), which may stand far
// above its last txn when few flow, and a joiner's txn between the two
// would come below a handoff already sent at S (simulator seed 728888924).
func (r *Replica) JoinFloor() txnid.ID {
	if r.exec == nil {
		return txnid.Zero
	}
	return r.exec.SafeUpTo()
}

// Outbox returns what the driver must do, in order, and forgets it.
func (r *Replica) Outbox() []Output {
	out := r.out
	r.out = nil
	return out
}

// Results returns the Done of every txn executed since the last call, in
// order, and forgets them. Each goes to its txn's initiator.
func (r *Replica) Results() []*wire.Done {
	res := r.results
	r.results = nil
	return res
}

// ---- the feed ----

// OnTxn takes a txn of the feed. It reports whether the txn was taken in:
// false when the replica drops its feed (needs a rejoin) or refused it.
func (r *Replica) OnTxn(inv partition.Invocation) bool {
	switch {
	case r.state == ReplicaHeld:
		// Dropped, not refused: a held replica's content stays as it
		// was when it was held, whatever its feed still sends.
		return false
	case r.dst != nil:
		if err := r.dst.OnTxn(inv); err != nil {
			// A txn of the feed that is not taken in leaves a hole: a
			// live replica is no longer a copy, an attempt would build
			// one that is not.
			r.refused(fmt.Sprintf("txn %v refused: %v", inv.ID, err))
			return false
		}
		r.collectDest()
		return true
	case r.exec != nil:
		if err := r.exec.Offer(inv); err != nil {
			// The replica can no longer follow the feed: it is not a
			// copy any more.
			r.Fail(fmt.Sprintf("txn %v refused: %v", inv.ID, err))
			return false
		}
		return true
	}
	return false
}

// OnHeartbeat takes a heartbeat of the feed; it reports whether it was
// taken in, as OnTxn.
func (r *Replica) OnHeartbeat(id txnid.ID) bool {
	switch {
	case r.state == ReplicaHeld:
		return false
	case r.dst != nil:
		if err := r.dst.OnHeartbeat(id); err != nil {
			r.refused(fmt.Sprintf("heartbeat %v refused: %v", id, err))
			return false
		}
		r.collectDest()
		return true
	case r.exec != nil:
		if last, ok := r.exec.LastFrom(id.Initiator()); ok && id <= last {
			// A heartbeat at or below the floor the initiator was tracked
			// from says nothing new. With joins it comes on a feed
			// already open: one the initiator sent before it read its
			// join's floor (docs/DESIGN.md "Sequencers per partition").
			// Refused, it failed a live replica (.ci/run,
			// TestCutNodeFencedByPeers: "initiator 2 sent ...c20.i2 after
			// ...c20.i3"). A txn below it is still refused.
			return false
		}
		if err := r.exec.Heartbeat(id); err != nil {
			r.Fail(fmt.Sprintf("heartbeat %v refused: %v", id, err))
			return false
		}
		return true
	}
	return false
}

// refused ends what the replica was doing after its destination attempt,
// or the replica it made live, could not take in a message of the feed.
func (r *Replica) refused(why string) {
	if r.dst != nil && !r.dstLive {
		r.dst.Abort(wire.AbortInternal, why)
		r.collectDest()
		return
	}
	r.Fail(why)
}

// AddInitiator: a feed from in opened. Its first message follows. The
// driver gives in a floor at or above JoinFloor() read after this call:
// in sends nothing at or below it.
func (r *Replica) AddInitiator(in txnid.Initiator) {
	if r.initiators[in] {
		return
	}
	r.initiators[in] = true
	switch {
	case r.dst != nil:
		// The attempt buffers the newcomer's txns too. What it sent
		// before went to the source alone: the attempt's proposal waits
		// for it, and its handoff checks it holds the newcomer's txns
		// from E on (docs/DESIGN.md "Feeds that open late").
		r.dst.AddInitiator(in)
		r.collectDest()
	case r.exec != nil:
		// The driver sends the initiator a floor at or above what this
		// replica executed, and the initiator's IDs start above its floor
		// (docs/DESIGN.md "An initiator that joins"), so the replica's
		// safe point need not fall back to Zero for it: a source that
		// chose E before the initiator joined still holds a boundary at
		// E, and its handoff is not held up by a newcomer that has sent
		// nothing yet.
		r.exec.AddInitiatorAbove(in, r.exec.SafeUpTo())
	}
}

// RemoveInitiator: in's node is dead; nothing more comes from it.
func (r *Replica) RemoveInitiator(in txnid.Initiator) {
	if !r.initiators[in] {
		return
	}
	delete(r.initiators, in)
	if r.dst != nil {
		r.dst.RemoveInitiator(in)
		r.collectDest()
		return
	}
	if r.exec != nil {
		r.exec.RemoveInitiator(in)
	}
}

// Fail drops the replica's content: it is no longer a copy (a refused txn,
// a feed lost while its initiator lives, a tail not repaired). Its
// attempts end; it needs a rejoin. Nothing happens if it already does.
func (r *Replica) Fail(why string) {
	if r.state == ReplicaNeedsRejoin {
		return
	}
	if r.src != nil {
		r.src.Abort(wire.AbortShutdown, "source replica failed: "+why)
		r.collectSource()
	}
	if r.dst != nil && !r.dstLive {
		r.dst.Abort(wire.AbortShutdown, "destination replica failed: "+why)
		r.collectDest() // ends the attempt: needs-rejoin
	}
	if r.state != ReplicaNeedsRejoin {
		r.move(ReplicaNeedsRejoin)
	}
	r.dst, r.dstExec, r.dstLive, r.exec, r.heldWhy = nil, nil, false, nil, ""
	r.out = append(r.out, Output{Kind: OutFailed, Why: why})
}

// Lose: the replica may lack txns of its partition that were
// acknowledged elsewhere (a feed's hello names the partition missed, a
// lapse's settlement cannot say what it missed). othersLive says whether
// another replica of the partition is live now, in the driver's view.
// With one, the replica fails and is rebuilt from it. With none, failing
// would drop every row of the partition to keep out txns that no live
// replica holds either: a live replica is held instead (docs/DESIGN.md
// "Holding a partition"), and a held one stays held.
func (r *Replica) Lose(why string, othersLive bool) {
	switch {
	case othersLive:
		r.Fail(why)
	case r.state == ReplicaHeld:
	case r.state == ReplicaLive:
		if r.src != nil {
			r.src.Abort(wire.AbortShutdown, "source replica held: "+why)
			r.collectSource()
		}
		r.move(ReplicaHeld)
		r.heldWhy = why
		r.out = append(r.out, Output{Kind: OutHeld, Why: why})
	default:
		r.Fail(why)
	}
}

// AcceptLoss makes a held replica live again at its last txn: an admin
// accepted that the partition lacks what it missed (rejoin accept-loss).
// It executes its feed from there on, as it did before it was held.
func (r *Replica) AcceptLoss() error {
	if r.state != ReplicaHeld {
		return fmt.Errorf("%w: replica %d is %s, not held", ErrReplica, r.p, r.state)
	}
	r.move(ReplicaLive)
	r.heldWhy = ""
	r.out = append(r.out, Output{Kind: OutLossAccepted})
	return nil
}

// dropHeld drops a held replica's content for a rejoin from peer that
// rebuilds it: as a failure, so that the driver records it.
func (r *Replica) dropHeld(peer string) {
	r.move(ReplicaNeedsRejoin)
	r.dst, r.dstExec, r.dstLive, r.exec, r.heldWhy = nil, nil, false, nil, ""
	r.out = append(r.out, Output{Kind: OutFailed, Why: "held replica dropped: a rejoin from " + peer + " rebuilds it"})
}

// Step runs up to n ready txns, keeps each one's Done for Results, and
// pumps the source attempt after each one, or once if none ran: the source
// moves between two txns, never during one. It returns how many ran. A
// driver that measures the source's moves in wall time (the handoff's
// pause) calls it with n = 1 while a source attempt runs.
func (r *Replica) Step(n int) int {
	if r.exec == nil || r.state == ReplicaHeld {
		return 0
	}
	did := 0
	for range n {
		res, ok := r.exec.Step()
		if !ok {
			break
		}
		did++
		if !r.dropResults {
			r.results = append(r.results, &wire.Done{Partition: r.p, ID: res.ID, Out: append([]byte(nil), res.Out...), Err: wire.ErrText(res.Err)})
		}
		r.pumpSource()
	}
	if did == 0 {
		r.pumpSource()
	}
	return did
}

// StepBurst is the most txns a driver runs between two looks at its
// inputs: a backlog of txns never starves the feed, an attempt's messages
// or a stop for longer than that.
const StepBurst = 256

// Run is a driver's turn at the txns: up to StepBurst ready ones, as Step
// runs them. While a source attempt runs it takes them one a call through
// each, which the driver wraps around the call: the source's moves are
// timed around each (the handoff's pause starts in the call where it
// began, never a burst earlier). It stops at the first call that ran none
// and at each's first error, which it returns. more says the driver steps
// again before it waits for an event: a txn ran, or the source's last pump
// stopped at its PumpBlocksMax with more to cut.
func (r *Replica) Run(each func(step func() int) error) (ran int, more bool, err error) {
	if r.src == nil || each == nil {
		ran = r.Step(StepBurst)
		return ran, ran > 0 || r.SourcePending(), nil
	}
	for ran < StepBurst {
		n := 0
		err = each(func() int { n = r.Step(1); return n })
		ran += n // a txn that ran counts, whatever each said after it
		if err != nil || n == 0 {
			break
		}
	}
	return ran, ran > 0 || r.SourcePending(), err
}

// SourcePending reports whether the source attempt's last pump stopped
// at its SourceConfig.PumpBlocksMax (Source.Pending): the driver steps
// again, Step(0) if no txn is ready, before it waits for an event.
func (r *Replica) SourcePending() bool { return r.src != nil && r.src.Pending() }

func (r *Replica) pumpSource() {
	if r.src != nil {
		r.src.Pump()
		r.collectSource()
	}
}

// Tick advances the attempts' clocks by one tick.
func (r *Replica) Tick() {
	if r.src != nil {
		r.src.Tick()
		r.collectSource()
	}
	if r.dst != nil && !r.dstLive {
		r.dst.Tick()
		r.collectDest()
	}
}

// ---- the source attempt ----

// StartSource starts serving a source attempt for peer with cfg (its
// header carries the epoch). The replica must be live. A newer attempt of
// the same peer supersedes the running one (its claim is gone, whether or
// not it has noticed yet: docs/DESIGN.md step 1); another peer's attempt,
// or a stale epoch, is refused while one runs.
func (r *Replica) StartSource(peer string, cfg SourceConfig) error {
	epoch := cfg.Header.Epoch
	if r.state != ReplicaLive || r.exec == nil {
		return fmt.Errorf("%w: replica %d is %s, not live", ErrReplica, r.p, r.state)
	}
	if cfg.Header.Partition != r.p {
		return fmt.Errorf("%w: a source attempt of partition %d on replica %d", ErrReplica, cfg.Header.Partition, r.p)
	}
	if r.src != nil {
		if peer != r.srcPeer || epoch <= r.srcEp {
			return fmt.Errorf("%w: replica %d already serves a rejoin (to %s, epoch %d)", ErrReplica, r.p, r.srcPeer, r.srcEp)
		}
		r.src.Abort(wire.AbortStaleEpoch, fmt.Sprintf("superseded by epoch %d", epoch))
		r.collectSource()
	}
	src, err := NewSource(r.exec, cfg)
	if err != nil {
		return err
	}
	// A new source has nothing to send before its first input.
	r.src, r.srcPeer, r.srcEp = src, peer, epoch
	return nil
}

// source returns the running source attempt of epoch, or an error.
func (r *Replica) source(epoch uint64) (*Source, error) {
	if r.src == nil || r.srcEp != epoch {
		return nil, fmt.Errorf("%w: replica %d serves no source attempt of epoch %d", ErrReplica, r.p, epoch)
	}
	return r.src, nil
}

// OnSourceMessage hands the destination's message to the source attempt
// of epoch. The error says why it was refused; whether the attempt lives
// on shows in the outbox.
func (r *Replica) OnSourceMessage(epoch uint64, m wire.Message) error {
	src, err := r.source(epoch)
	if err != nil {
		return err
	}
	err = src.OnMessage(m)
	r.collectSource()
	return err
}

// ResumeSource resends, on a new connection, what the destination may have
// lost with the old one.
func (r *Replica) ResumeSource(epoch uint64) error {
	src, err := r.source(epoch)
	if err != nil {
		return err
	}
	src.Resume()
	r.collectSource()
	return nil
}

// AbortSource ends the source attempt of epoch from outside (claim lost,
// connection lost, peer dead, node stopping); epoch 0: whichever runs. No
// attempt: nothing happens.
func (r *Replica) AbortSource(epoch uint64, reason wire.AbortReason, text string) {
	if r.src == nil || (epoch != 0 && epoch != r.srcEp) {
		return
	}
	r.src.Abort(reason, text)
	r.collectSource()
}

// collectSource moves the source's messages to the outbox and ends the
// attempt once it is final.
func (r *Replica) collectSource() {
	src := r.src
	if msgs := src.Outbox(); len(msgs) > 0 {
		r.out = append(r.out, Output{Kind: OutSourceMessages, Epoch: r.srcEp, Msgs: msgs, State: src.State()})
	}
	switch src.State() {
	case StateDone:
		// Only the destination's HandoffAck gets here: it is live at E
		// with our digest.
		r.out = append(r.out, Output{Kind: OutSourceEnded, Epoch: r.srcEp, State: StateDone, Source: src})
		r.src = nil
	case StateAborted:
		err := src.Err()
		if err == nil {
			err = errors.New("recovery: source attempt ended")
		}
		r.out = append(r.out, Output{Kind: OutSourceEnded, Epoch: r.srcEp, State: StateAborted, Err: err, Source: src})
		r.src = nil
	}
}

// ---- the destination attempt ----

// CheckDestination applies the fence to an attempt of epoch from peer,
// changing nothing: resume is true when it is the running attempt's (same
// epoch and peer, not live yet), which a new connection resumes. Else a
// new attempt may start only on a replica that is not live, above the
// running attempt's epoch and above the fence, hearing some initiator.
// The driver records the epoch durably between this check and
// StartDestination, which checks again.
func (r *Replica) CheckDestination(peer string, epoch uint64) (resume bool, err error) {
	if r.state == ReplicaLive {
		return false, fmt.Errorf("%w: replica %d is live", ErrReplica, r.p)
	}
	if r.dst != nil {
		if epoch < r.dstEp {
			return false, fmt.Errorf("%w: epoch %d is below the current attempt's %d", ErrReplica, epoch, r.dstEp)
		}
		if epoch == r.dstEp {
			if peer != r.dstPeer {
				return false, fmt.Errorf("%w: the attempt of epoch %d is %s's, not %s's", ErrReplica, epoch, r.dstPeer, peer)
			}
			return true, nil
		}
	}
	if epoch <= r.fence {
		return false, fmt.Errorf("%w: epoch %d is not above %d, the highest replica %d has seen", ErrReplica, epoch, r.fence, r.p)
	}
	if len(r.initiators) == 0 {
		return false, fmt.Errorf("%w: replica %d hears no initiator yet", ErrReplica, r.p)
	}
	return false, nil
}

// StartDestination starts a destination attempt from peer with cfg (its
// header carries the epoch; the replica fills in the initiators),
// superseding a lower one. The driver has recorded the epoch durably: the
// fence rises to it even if the start then fails, so it is never taken
// again. Resuming the running attempt is ResumeDestination.
func (r *Replica) StartDestination(peer string, cfg DestinationConfig) error {
	epoch := cfg.Header.Epoch
	if cfg.Header.Partition != r.p {
		return fmt.Errorf("%w: a destination attempt of partition %d on replica %d", ErrReplica, cfg.Header.Partition, r.p)
	}
	resume, err := r.CheckDestination(peer, epoch)
	if err != nil {
		return err
	}
	if resume {
		return fmt.Errorf("%w: the attempt of epoch %d runs: resume it", ErrReplica, epoch)
	}
	r.fence = epoch
	if r.state == ReplicaHeld {
		// A live replica to rebuild it from is back: the rejoin brings
		// what the held one missed.
		r.dropHeld(peer)
	}
	if r.dst != nil {
		r.dst.Abort(wire.AbortStaleEpoch, fmt.Sprintf("superseded by epoch %d", epoch))
		r.collectDest()
	}
	exec, err := r.newExecutor()
	if err != nil {
		return err
	}
	cfg.Initiators = r.Initiators()
	dst, err := NewDestination(exec, cfg)
	if err != nil {
		return err
	}
	r.move(ReplicaRejoining)
	// A new destination has nothing to send before its first input.
	r.dst, r.dstExec, r.dstPeer, r.dstEp, r.dstLive = dst, exec, peer, epoch, false
	r.exec = nil
	return nil
}

// destination returns the running, not yet live, destination attempt of
// epoch, or an error.
func (r *Replica) destination(epoch uint64) (*Destination, error) {
	if r.dst == nil || r.dstLive || r.dstEp != epoch {
		return nil, fmt.Errorf("%w: replica %d runs no destination attempt of epoch %d", ErrReplica, r.p, epoch)
	}
	return r.dst, nil
}

// OnDestinationMessage hands the source's message to the destination
// attempt of epoch. Once it is live, the message goes to it all the same
// (a late ack or heartbeat is harmless) and nothing is sent back.
func (r *Replica) OnDestinationMessage(epoch uint64, m wire.Message) error {
	if r.dst == nil || r.dstEp != epoch {
		return fmt.Errorf("%w: replica %d runs no destination attempt of epoch %d", ErrReplica, r.p, epoch)
	}
	err := r.dst.OnMessage(m)
	r.collectDest()
	return err
}

// ResumeDestination resends, on a new connection, what the source may
// have lost with the old one. An attempt gone live is not resumed.
func (r *Replica) ResumeDestination(epoch uint64) error {
	dst, err := r.destination(epoch)
	if err != nil {
		return err
	}
	dst.Resume()
	r.collectDest()
	return nil
}

// AbortDestination ends the destination attempt of epoch from outside (a
// node of the partition failed, the node stops); epoch 0: whichever runs.
// An attempt gone live is not aborted.
func (r *Replica) AbortDestination(epoch uint64, reason wire.AbortReason, text string) {
	if r.dst == nil || r.dstLive || (epoch != 0 && epoch != r.dstEp) {
		return
	}
	r.dst.Abort(reason, text)
	r.collectDest()
}

// collectDest moves the destination's messages to the outbox and looks at
// its state: live, the replica executes on its executor; aborted, the
// partial replica goes with it.
func (r *Replica) collectDest() {
	dst := r.dst
	msgs := dst.Outbox()
	if r.dstLive {
		return // after live, nothing goes out
	}
	if len(msgs) > 0 {
		r.out = append(r.out, Output{Kind: OutDestinationMessages, Epoch: r.dstEp, Msgs: msgs, State: dst.State()})
	}
	switch dst.State() {
	case StateLive:
		r.dstLive = true
		r.exec = r.dstExec
		r.move(ReplicaLive)
		r.out = append(r.out, Output{Kind: OutLive, Epoch: r.dstEp, State: StateLive, Destination: dst})
	case StateAborted:
		r.out = append(r.out, Output{Kind: OutDestinationEnded, Epoch: r.dstEp, State: StateAborted, Err: dst.Err(), Destination: dst})
		r.dst, r.dstExec, r.exec = nil, nil, nil
		r.move(ReplicaNeedsRejoin)
	}
}

// Stop ends the running attempts: the node stops. The replica's state
// stays as it is, but a destination attempt that ends leaves it needing a
// rejoin.
func (r *Replica) Stop(text string) {
	r.AbortSource(0, wire.AbortShutdown, text)
	r.AbortDestination(0, wire.AbortShutdown, text)
}
