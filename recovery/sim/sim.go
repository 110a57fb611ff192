package sim

import (
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"strings"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// Options change how Run runs a seed; the zero value runs it as drawn.
type Options struct {
	// Trace collects a line per event in Result.Trace. It changes nothing
	// else: a run draws the same numbers with or without it.
	Trace bool
	// Tweak, if set, may change the knobs drawn from the seed before the
	// run starts (the equivalence test pins the block size and the codec).
	// The workload, network and fault streams do not move with them.
	Tweak func(*Knobs)
	// Sabotage breaks the system under test on purpose, to show that the
	// invariants catch it.
	Sabotage Sabotage
}

// Sabotage is a deliberate bug the simulator can inject.
type Sabotage uint8

const (
	// SabotageNone injects nothing.
	SabotageNone Sabotage = iota
	// SabotageDestinationWrite changes a row of the destination replica
	// behind the protocol's back right after it goes live, so invariant (a)
	// must fail.
	SabotageDestinationWrite
	// SabotageIgnoreClaimLoss makes every holder's check (and its lease
	// guard) blind to a lost claim, so a paused holder does not stop:
	// invariant (e) must fail.
	SabotageIgnoreClaimLoss
	// SabotageSettleMissed hides from a lost registration's settlement
	// what the initiators' hellos said they sent without a feed to the
	// node (wire.Hello.Missed), so a replica that missed txns stays live:
	// invariant (a) must fail where one did.
	SabotageSettleMissed
	// SabotageSettleAlone tells a lost registration's settlement that no
	// other replica was live meanwhile (recovery.SettleInput.Others), so
	// a replica that missed txns another replica acknowledged, from a node
	// that cannot say it sent them, stays live: invariant (a) must fail
	// where one did.
	SabotageSettleAlone
	// SabotageHoldAlways tells every replica lost for txns it may lack
	// (recovery.Replica.Lose) that no other replica is live, so it is
	// held where it should fail and be rebuilt: invariant (f) must fail
	// where another was live.
	SabotageHoldAlways
)

// Result is what one seed did.
type Result struct {
	Seed  uint64
	Knobs Knobs
	// Err is the first invariant violated (a *Violation), or nil.
	Err error
	// Trace holds a line per event when Options.Trace is set.
	Trace []string
	// Ticks is how long the run took; Attempts how many attempts it
	// started (the last one went live unless Err is set).
	Ticks    uint64
	Attempts int
	// LiveTick is when the destination went live (0 if it did not).
	LiveTick uint64
	// FinalTxn and FinalDigest are the last txn every replica executed and
	// the digest they agree on after it.
	FinalTxn    txnid.ID
	FinalDigest uint64
	Stats       Stats
}

// Stats counts what a run exercised, so tests can check the seeds cover
// what they claim to.
type Stats struct {
	Txns, Heartbeats   int
	Frames, FrameBytes int64
	// Snapshot, Deletes, Upserts: rows the destinations applied, by kind.
	Snapshot, Deletes, Upserts int64
	// Rounds and LogBytesPeak are the largest of any source attempt;
	// ThrottledTicks the sum, and TxnsHeldForRound the sum of the times a
	// source's gate held a txn for its round's budget.
	Rounds, LogBytesPeak int
	ThrottledTicks       int64
	TxnsHeldForRound     int64
	// TxnsDropped: buffered txns below E the live destination dropped.
	TxnsDropped int
	// StaleDelivered counts messages of a superseded attempt delivered to
	// a newer attempt's processor; StaleRejected what the processors
	// counted as rejected; StaleAccepted those not rejected (invariant d:
	// must stay 0). GhostDropped counts late messages that found no newer
	// attempt.
	// StaleToRunning counts those that reached a processor still running
	// (an ended one refuses everything without looking at the epoch).
	StaleDelivered, StaleToRunning, StaleRejected, StaleAccepted, GhostDropped int64
	// FaultsFired counts faults injected, by kind in Kinds (named by
	// FaultKindNames).
	FaultsFired int
	Kinds       [faultKinds]int
	// Phases counts the faults fired by the phase they hit.
	Phases [phases]int
	// CutsUnnoticed counts sides of a cut connection left to find out by
	// their stall timeout.
	CutsUnnoticed int
	// BeatAsks counts heartbeat asks answered (Knobs.BeatAsks).
	BeatAsks int
	// BeatsAhead counts heartbeats ahead of their initiator's clock: a
	// lead (Knobs.BeatLeadTicks) or an answer to an ask.
	BeatsAhead int
	// PumpsCapped counts the source pumps that stopped at
	// SourceConfig.PumpBlocksMax with more to cut, pumped again at once
	// as the node's replica loop does.
	PumpsCapped int
	// Resumed counts attempts resumed on a new connection after a cut;
	// GraceExpired, sources that aborted after redialling for the grace;
	// HoldsGivenUp, sources that aborted sooner, holding their partition
	// for a destination they could not reach (Knobs.BrokenHoldTicks).
	Resumed, GraceExpired, HoldsGivenUp int
	// DigestChecks counts comparisons of the live replicas at a common txn.
	DigestChecks int
	// Claims counts claims made; ClaimsExpired those deleted when their
	// lease ran out; ClaimLostStops holders that stopped on finding their
	// claim lost (or, with the lease guard, not certainly held).
	Claims, ClaimsExpired, ClaimLostStops int
	// PausedLate counts late messages of a paused holder's attempt that
	// reached a newer attempt's running processor; PausedRejected those
	// rejected by epoch (all of them, or invariant d fails).
	PausedLate, PausedRejected int64
	// DualWriteTicks counts ticks at which two holders that both believed
	// they held the claim both had a write accepted (possible only without
	// Knobs.LeaseGuard; in epoch order at each node).
	DualWriteTicks int
	// WritesAfterLoss counts writes accepted (and destinations gone live)
	// of holders that still believed they held a claim the coordinator had
	// deleted (after its lease ran out, possible only without
	// Knobs.LeaseGuard).
	WritesAfterLoss int
	// Takeovers counts supervisor failovers; TakeoverStarts those where
	// the new leader assigned the task again from the coordinator alone.
	Takeovers, TakeoverStarts int
	// Assigns counts the supervisor's assignments (supervise.Decide);
	// StaleResets the health task's resets of the task; Touches the task
	// record's refreshes on progress; Requeues the attempts requeued by
	// their holder; HellosRefused the hellos the destination refused on
	// its claim check; Outages the coordinator's outages.
	Assigns, StaleResets, Touches, Requeues, HellosRefused, Outages int
	// StartsRefused counts claims whose task would not start (done
	// meanwhile, by the destination): the holder releases them at once.
	// Revokes counts the supervisor's writes that revoked a claim (an
	// assignment moved off a dead source while its claim stood).
	StartsRefused, Revokes int
	// CutOffs counts source nodes cut off from the coordinator while it
	// ran on for the others.
	CutOffs int
	// RegLosses counts source nodes that lost their registration while
	// their process ran on (registration.go); RegLapses those whose lease
	// ran out meanwhile; FeedsBroken the initiators' feeds to them that
	// broke meanwhile; Joiners the new initiator processes that
	// registered meanwhile, and JoinerRefused their txns refused for a
	// feed not open yet. The settlements (recovery.Settle): SettleWaits
	// counts waits for a node's feed, SettledKept the replicas kept live,
	// SettledFailed those failed (or held: Held counts the holds, of
	// these and of the two below), SettleUnknown of them for a node that
	// could not say what it sent; FailedOnRedial replicas failed on a feed
	// re-opened by the same process that could not resume (takeUp).
	RegLosses, RegLapses, FeedsBroken, Joiners, JoinerRefused int
	SettleWaits, SettledKept, SettledFailed, SettleUnknown    int
	FailedOnRedial                                            int
	// RegLossesAlone counts the losses that hit the only live replica
	// (regLossPlan.alone), SettledAlone the settlements that kept a
	// replica by recovery.Settle's rule 6 (its partition alone).
	RegLossesAlone, SettledAlone int
	// RefusedNoLive counts the workload's txns refused for no live
	// replica in the initiators' view (recovery.ErrNoLiveReplica),
	// RefusedLogFull those refused for the feeds to the live ones broken
	// with full logs (recovery.ErrFeedLogFull).
	RefusedNoLive, RefusedLogFull int
	// FeedsResumed counts the broken feeds a redial took up where the
	// replica stopped (docs/DESIGN.md "Feeds that resume"); GapsFilled
	// those of them that had lost txns in flight, TxnsResent the txns
	// their logs sent again; FailedOnResumeMissed the replicas a resumed
	// feed failed for its hello's Missed. FeedItemsLost counts the txns
	// and heartbeats in flight when a feed broke.
	FeedsResumed, GapsFilled, TxnsResent, FailedOnResumeMissed, FeedItemsLost int
	// RefusedRedialing counts the txns an initiator refused while a node
	// out of its view had a redial on its way (recovery.Unfed: dialing).
	RefusedRedialing int
	// Joins counts the initiators' joins of the partition (Knobs.Joins),
	// RefusedJoining the txns refused while one was not answered yet.
	Joins, RefusedJoining int
	// Silenced counts the initiators' processes that went silent with
	// their feeds open, Fenced those the replicas then took for dead
	// (silent.go); SilencesPut off the silences left for a feed into a
	// source node that was broken or failed.
	Silenced, Fenced, SilencesPutOff int
	// TailTxnsRepaired counts the txns of a fenced initiator that a
	// source replica took from a peer's tail, DstTailTxnsRepaired those
	// the destination node's replica took.
	TailTxnsRepaired, DstTailTxnsRepaired int
	// ResumesClosed counts the resumed feeds the core closed at once, a
	// txn having been missed there (its log full) while the dial was out
	// (recovery.Initiator.FeedResumed).
	ResumesClosed int
	// GateHeld counts the polls at which a source node found a new
	// assignment and left it, its lost registration not settled yet.
	GateHeld int
	// Held counts the source replicas held rather than failed for txns
	// they may lack, no other replica live (holds.go); HeldFailed those
	// lost again once another was live, and failed; HeldLacking the txns
	// that another replica ran and a replica held at the end lacks.
	// HeldEnds: the run ended with no live replica, the partition held.
	Held, HeldFailed, HeldLacking, HeldEnds int
}

// Violation is a broken invariant: the check that failed and why.
type Violation struct {
	Tick  uint64
	Check string
	Msg   string
}

func (v *Violation) Error() string {
	return fmt.Sprintf("tick %d: invariant %s: %s", v.Tick, v.Check, v.Msg)
}

// partitionID is the simulated partition's ID in every message.
const partitionID = 7

// baseMillis is the simulated clock's reading at tick 0.
const baseMillis = txnid.EpochUnixMillis + 1000

// Run runs one seed to its end and reports what happened. It starts no
// goroutine and reads no clock; every random choice comes from one PCG
// seeded by seed, so the same seed and options give the same Result, trace
// included, byte for byte.
func Run(seed uint64, opts Options) (res Result) {
	w := newWorld(seed, opts)
	defer func() {
		if r := recover(); r != nil {
			v, ok := r.(*Violation)
			if !ok {
				// A panic in the code under test is a failure of the seed,
				// with the stack to find it.
				v = &Violation{Tick: w.tick, Check: "panic", Msg: fmt.Sprintf("%v\n%s", r, debug.Stack())}
			}
			w.err = v
			w.tracef("FAIL %v", v)
		}
		res = w.result()
	}()
	w.setup()
	for !w.done {
		w.step()
	}
	return res
}

// world is one simulated run: the clock, the initiators, the source node
// and its replica, the destination node with one replica per attempt, the
// network, the faults, and an oracle replica that receives the whole feed
// at once and never takes part in a rejoin.
type world struct {
	// asks are the heartbeat asks in flight to other initiators
	// (Knobs.BeatAsks), in the order sent.
	asks []beatAsk
	// silenceRng draws the silences (silent.go), drawn after every other
	// stream; silences are the ones planned, in tick order.
	silenceRng *rand.Rand
	silences   []silencePlan
	// dstTails is what the destination node's replica kept of each
	// initiator's txns, for its repair of a fenced one's tail; anew with
	// each replica core (newDstReplica).
	dstTails recovery.Tails
	// dstTook lists the txns the destination node's replica took in, in
	// order, for the count of what a held replica lacks (holds.go); anew
	// with each replica core.
	dstTook []txnid.ID
	// joinAnswers are the answers to joins (Knobs.Joins) on their way
	// back from the oracle and the destination node, in the order sent.
	joinAnswers []joinAnswer
	seed        uint64
	k           Knobs
	opts        Options
	// Three streams from the one seeded PCG: the workload's (so it does
	// not depend on knobs or timing), the network's and scheduler's, and
	// the faults'.
	work, net, faultRng *rand.Rand
	regRng              *rand.Rand
	// feedRng draws the feeds' breaks, gaps and acks (feedbreak.go), its
	// own stream so that runs without a break draw as they did before.
	// feedBreaks are the breaks planned outside a lost registration, not
	// fired yet.
	// feedBreaksFired counts them once fired.
	feedRng         *rand.Rand
	feedBreaks      []feedBreak
	feedBreaksFired int
	// regPlan is the run's lost registration (registration.go), drawn from
	// a stream of its own; regFired once it fired. joiner is its new
	// initiator process, if it has one. viewDirty: the initiators take
	// the view again at the next tick.
	regPlan   regLossPlan
	regFired  bool
	joiner    *initiator
	viewDirty bool
	// conns numbers the feed connections into the source nodes.
	conns uint64

	tick uint64
	tr   tracer
	err  error
	done bool

	reg     *partition.Registry
	enc     wire.TupleEncoder
	schemas []partition.Schema

	inits []*initiator
	// view is the initiators' membership view: every node alive, the
	// sources' replicas live, the destination's and the oracle's not.
	view *recovery.InitiatorView
	// srcs are the source nodes' replicas, live from the start (the first
	// is "src", the second "src2"); srcExec is the first's executor.
	srcs    []*srcReplica
	srcExec *partition.Executor
	ref     *partition.Executor

	atts  []*attempt
	epoch uint64 // the last attempt's, without claims
	// dst is the destination node's replica core, as recovery/node runs
	// it: it holds the fence (the highest epoch the node has taken,
	// durable: a restart keeps it), the attempts' processors, and the
	// replica once live. dstExec is the executor it built last: the
	// newest attempt's replica.
	dst      *recovery.Replica
	dstExec  *partition.Executor
	faults   []*fault
	ghostSrc *pipe // late messages to the source node
	ghostDst *pipe // late messages to the destination node

	live       *attempt
	liveTick   uint64
	quiescing  bool
	quietTick  uint64
	lastTxn    txnid.ID // the highest txn ID sent
	lastCmp    txnid.ID
	lastRefCmp [2]txnid.ID // by source

	// claims: attempts claim the task in the coordinator and take its
	// epoch (every seed; a script when it asks). sup is the supervisor,
	// coord the coordinator.
	// writeEpoch is the highest epoch whose write each node accepted
	// (source node, destination node): invariant (e). claimEpoch is the
	// claim's epoch as last seen (noteClaims).
	claims     bool
	sup        supervisor
	coord      coordinator
	writeEpoch [2]uint64
	claimEpoch uint64
	// lose: a script's one-shot losses: the next message of each type a
	// processor sends is lost on the way (the node's test hooks that lose
	// a Handoff or a HandoffAck).
	lose map[wire.MsgType]bool
	// dstComplete: the live destination's completion failed, and is tried
	// again at dstCompleteAt.
	dstComplete   *attempt
	dstCompleteAt uint64

	// scripted: a scenario script drives the world; nothing happens on its
	// own (no workload, no supervisor, no faults). auto: a script's
	// supervisor and source node run by themselves all the same.
	scripted, auto bool
	// late is a script's late initiator (1-based; 0: none): its feeds to
	// the source and destination nodes open only when the script says.
	late int

	stats Stats
}

// initiator is the product's initiator core (recovery.Initiator) on its
// own skewed view of the simulated clock: it sequences the workload's
// txns, heartbeats on its schedule, and keeps its feeds to the source
// nodes, the destination node and the oracle (initiator.go).
type initiator struct {
	idx  int
	id   txnid.Initiator
	core *recovery.Initiator
	skew int64
	// toSrc: a link to each source replica, in the order of world.srcs.
	toSrc []*feedLink
	// late: a script's late initiator, whose feeds to the source nodes
	// and the destination node open only when the script says (opened;
	// its dials fail until then). Where its feed is not open it sends
	// nothing, and the replicas there do not track it.
	late   bool
	opened map[string]bool
	// joiner: a new initiator process that registers while a source node
	// is away (registration.go); active once it has. Its workload comes
	// from rng; its feed to the node opens from openAt on (0: not yet).
	joiner, active bool
	// silent: a script stopped its process (silent.go); fenced: the
	// replicas took it for dead since.
	silent, fenced bool
	rng            *rand.Rand
	openAt         uint64
	joinTick       uint64
	// dstJoinTick: the tick its join of the partition (Knobs.Joins)
	// reached the destination node.
	dstJoinTick uint64
	// feeds is the core's I/O.
	feeds *initiatorFeeds
	// out is what the core sent since the world last routed it, in order,
	// each message with the nodes it went to (routeFeed).
	out []outMsg
}

// outMsg is one message an initiator's core sent, and to which nodes.
type outMsg struct {
	m  wire.Message
	to map[string]bool
}

func newWorld(seed uint64, opts Options) *world {
	root := rand.New(rand.NewPCG(seed, 0x5e1f5eed))
	k := drawKnobs(root)
	w := &world{seed: seed, opts: opts, reg: newRegistry()}
	w.tr.on = opts.Trace
	w.work = rand.New(rand.NewPCG(root.Uint64(), root.Uint64()))
	w.net = rand.New(rand.NewPCG(root.Uint64(), root.Uint64()))
	w.faultRng = rand.New(rand.NewPCG(root.Uint64(), root.Uint64()))
	regSeed1, regSeed2 := root.Uint64(), root.Uint64()
	// Drawn last, so every stream above draws as it did before.
	w.feedRng = rand.New(rand.NewPCG(root.Uint64(), root.Uint64()))
	w.silenceRng = rand.New(rand.NewPCG(root.Uint64(), root.Uint64()))
	if opts.Tweak != nil {
		opts.Tweak(&k)
	}
	w.k = k
	w.claims = true
	w.regRng = rand.New(rand.NewPCG(regSeed1, regSeed2))
	return w
}

// setup builds the partition: tables, initiators, the loaded source, the
// oracle with the same rows, and the fault plan.
func (w *world) setup() {
	if err := w.k.validate(); err != nil {
		w.violate("knobs", "%v", err)
	}
	w.schemas = []partition.Schema{kvSchema, acctSchema}[:w.k.Tables]
	var srcIDs []string
	for i := range w.k.Sources {
		id := srcNode
		if i > 0 {
			id = fmt.Sprintf("%s%d", srcNode, i+1)
		}
		srcIDs = append(srcIDs, id)
	}
	w.view = initiatorView(srcIDs)
	for i := 0; i < w.k.Initiators; i++ {
		in := &initiator{idx: i, id: txnid.Initiator(i + 1), late: i+1 == w.late, opened: map[string]bool{}}
		if w.k.SkewMillisMax > 0 {
			in.skew = w.work.Int64N(int64(2*w.k.SkewMillisMax+1)) - int64(w.k.SkewMillisMax)
		}
		w.newInitiatorCore(in)
		w.inits = append(w.inits, in)
		w.dial(in)
	}
	if !w.scripted {
		w.planRegLoss(w.regRng)
	}
	if p := &w.regPlan; p.on && p.joiner {
		// Built now, so every replica's feed links count it; it dials
		// and sends nothing until it registers.
		j := &initiator{idx: len(w.inits), id: txnid.Initiator(len(w.inits) + 1), late: true, joiner: true, opened: map[string]bool{},
			rng: rand.New(rand.NewPCG(p.joinerSeed, 1))}
		w.newInitiatorCore(j)
		w.inits = append(w.inits, j)
		w.joiner = j
	}
	for i := range w.k.Sources {
		sr := w.newSrcReplica(srcIDs[i])
		w.srcs = append(w.srcs, sr)
		for _, in := range w.inits {
			in.toSrc = append(in.toSrc, &feedLink{in: in, src: sr})
		}
	}
	w.srcExec = w.srcs[0].exec
	w.dst = w.newDstReplica(0)
	// The oracle hears every initiator from the start: it is the truth.
	w.ref = w.newReplica(func(in *initiator) bool { return !in.joiner })
	// The same rows from the same numbers: generators on one seed.
	loadSeed := w.work.Uint64()
	for _, sr := range w.srcs {
		w.load(sr.exec.Partition(), rand.New(rand.NewPCG(loadSeed, 1)))
	}
	w.load(w.ref.Partition(), rand.New(rand.NewPCG(loadSeed, 1)))
	w.sup.leader = 1
	w.coord = newCoordinator(0, w.srcs)
	w.ghostSrc = &pipe{name: "ghost>src", toSrc: true, codec: w.k.Codec}
	w.ghostDst = &pipe{name: "ghost>dst", codec: w.k.Codec}
	if !w.scripted {
		w.planFaults()
		w.planFeedBreaks()
		w.planSilences()
	}
	w.tracef("setup seed=%d %s", w.seed, w.k)
	w.tracef("source loaded: %s", w.describeReplica(w.srcExec))
}

// newSrcReplica builds source node id's live replica: a core over an
// executor that hears the initiators whose feed to the node is open.
func (w *world) newSrcReplica(id string) *srcReplica {
	fed := func(in *initiator) bool { return in.core.Fed(id) }
	exec := w.newReplica(fed)
	core, err := recovery.NewReplica(recovery.ReplicaConfig{Partition: partitionID, Live: true, DropResults: true,
		NewExecutor: func() (*partition.Executor, error) { return exec, nil }})
	if err != nil {
		panic(err)
	}
	sr := &srcReplica{id: id, core: core, exec: core.Executor(), conns: make([]uint64, len(w.inits)),
		told: map[int][]toldHello{}, broke: make([]bool, len(w.inits)),
		recv: make([]txnid.ID, len(w.inits)), redialAt: make([]uint64, len(w.inits)), dialing: make([]*pendingDial, len(w.inits)), gapTxns: make([]int, len(w.inits)),
		joined: make([]bool, len(w.inits))}
	for _, in := range w.inits {
		if fed(in) {
			// Tracked from the start, as if joined: a join changes
			// nothing but its floor.
			core.AddInitiator(in.id)
			sr.joined[in.idx] = true
			w.conns++
			sr.conns[in.idx] = w.conns
		}
	}
	return sr
}

// newDstReplica builds the destination node's replica core: it needs a
// rejoin, its fence is fence, and it hears the initiators whose feed to
// the destination is open.
func (w *world) newDstReplica(fence uint64) *recovery.Replica {
	// A fenced initiator's process is gone: the replica never hears it.
	fed := func(in *initiator) bool { return in.core.Fed(dstNode) && !in.fenced }
	w.dstTails, w.dstTook = recovery.Tails{}, nil
	core, err := recovery.NewReplica(recovery.ReplicaConfig{Partition: partitionID, Fence: fence, DropResults: true,
		NewExecutor: func() (*partition.Executor, error) {
			// Empty of initiators: the core adds those it tracks, as
			// recovery/node's replica does. An initiator with a feed
			// open there that never joined the partition (Knobs.Joins:
			// a joiner whose calls were refused before it joined) must
			// not be waited for: it never sends there (seed 2141312834).
			w.dstExec = w.newReplica(func(*initiator) bool { return false })
			return w.dstExec, nil
		}})
	if err != nil {
		panic(err)
	}
	for _, in := range w.inits {
		if fed(in) {
			core.AddInitiator(in.id)
		}
	}
	return core
}

// step is one tick of the world, in a fixed order of phases; within a
// phase the network decides the interleaving.
func (w *world) step() {
	w.tick++
	if w.tick > uint64(w.k.TicksMax) {
		w.violate("c", "not finished after %d ticks: %s", w.k.TicksMax, w.where())
	}
	w.stepCoordinator()
	if w.regPlan.on {
		w.stepRegLoss()
	}
	w.stepFeeds()
	w.stepSilences()
	w.supervise()
	if !w.scripted || w.auto {
		w.stepSourceNodes()
	}
	w.stepHolders()
	w.maybeFault()
	w.learnCuts()
	if w.scripted {
		// A script's run: idle initiators heartbeat every tick, and it
		// stops when the script says.
		for _, in := range w.inits {
			w.sendHeartbeat(in)
		}
	} else {
		w.sendWorkload()
	}
	w.answerAsks()
	w.deliverDue()
	w.stepExecutors()
	w.tickProcessors()
	w.compare()
	if !w.scripted {
		w.maybeFinish()
	}
}

// sendWorkload lets every initiator send a txn or a heartbeat. Its draws
// come from the workload stream alone and do not depend on the rejoin's
// progress (only on whether txns still flow), so the same seed sends the
// same txns at the same ticks whatever the knobs.
func (w *world) sendWorkload() {
	// A partition held with no replica live will not be live in the
	// run: its workload ends, as a live one's does (every txn is refused
	// meanwhile anyway: no replica live in the view).
	sending := !w.quiescing && !w.stranded() && (w.tick < uint64(w.k.WorkloadTicks) || w.live == nil || w.tick < w.liveTick+uint64(w.k.LiveTicks))
	final := false
	if !sending && !w.quiescing {
		// The feed ends with one more txn from each initiator, so every
		// replica has a txn to end on after E.
		w.quiescing, w.quietTick, final = true, w.tick, true
		w.tracef("workload ends: quiescing")
	}
	for _, in := range w.inits {
		if in.silent {
			continue // its process is stopped, or gone (silent.go)
		}
		if in.joiner {
			if in.active {
				w.joinerWorkload(in, sending, final)
			}
			continue
		}
		r := w.work
		if r.IntN(100) == 0 {
			// The initiator's clock steps, back or forward; its generator
			// keeps its IDs growing.
			in.skew = max(-100, min(100, in.skew+r.Int64N(21)-10))
		}
		txn := r.IntN(100) < w.k.TxnPct
		switch {
		case (sending && txn) || final:
			if err := w.sendTxn(in, w.drawTxn(r), w.view); err != nil && !w.refusedRedialing(in, err) && !w.refusedJoining(in, err) && !w.refusedNoLive(in, err) {
				w.violate("feed", "i%d refused a txn: %v", in.id, err)
			}
			in.core.Tick()  // a txn went out in this tick: no heartbeat due
			w.routeFeed(in) // but a feed opened since the last gets one
		case w.quiescing:
			w.sendHeartbeat(in)
		default:
			in.core.Tick()
			w.routeFeed(in)
		}
	}
}

// deliverDue delivers everything due this tick, one item at a time from a
// link drawn among those with something due.
func (w *world) deliverDue() {
	var due []link
	for {
		due = w.dueLinks(due[:0])
		if len(due) == 0 {
			return
		}
		due[w.net.IntN(len(due))].deliver(w)
	}
}

// ghostSrcHeld: a source node's current processor is frozen.
func (w *world) ghostSrcHeld() bool {
	for _, sr := range w.srcs {
		if a := w.srcAttemptOn(sr); a != nil && w.pausedNow(a) {
			return true
		}
	}
	return false
}

// stepCoordinator is the coordinator's tick: the nodes' activity, leases
// that run out.
func (w *world) stepCoordinator() {
	if !w.claims {
		return
	}
	for _, sr := range w.srcs {
		if !sr.dead && (sr.loss == nil || !w.coord.unreachable(w.tick, sr.id)) {
			w.coord.activity(w.tick, sr.id)
		}
	}
	w.coord.activity(w.tick, dstNode)
	if e, ok := w.coord.step(w.tick, uint64(w.k.ClaimTTLTicks)); ok {
		w.stats.ClaimsExpired++
		w.tracef("coordinator: claim of epoch %d expired (rev %d)", e, w.coord.rev)
	}
	w.noteClaims()
	for _, sr := range w.srcs {
		if _, inView := w.view.Nodes[sr.id]; sr.dead && inView {
			if _, registered := w.coord.nodes[sr.id]; !registered {
				// Its lease ran out: the initiators' views drop it, as the
				// node's does from etcd, and stop waiting for it. With joins
				// that is what lets them sequence again: a dead node never
				// answers a join.
				w.setInView(sr.id, false)
				w.tracef("%s node: its registration ended (rev %d): the initiators take it for dead", sr.id, w.coord.rev)
				w.redial()
			}
		}
	}
	if a := w.dstComplete; a != nil && w.tick >= w.dstCompleteAt {
		w.completeTask(a, claim.Attempt{Task: simTask, Executor: dstNode + ":destination", Epoch: a.epoch}, "destination")
	}
}

// startDueSources starts, without claims (a script's), the source side of
// every attempt whose time has come.
func (w *world) startDueSources() {
	if w.claims {
		return
	}
	for _, a := range w.atts {
		if a.src == nil && w.tick >= a.srcUpAt {
			w.startSource(a)
		}
	}
}

func (w *world) dueLinks(dst []link) []link {
	for _, in := range w.inits {
		for _, l := range in.toSrc {
			if l.due(w.tick) {
				dst = append(dst, l)
			}
		}
	}
	for _, a := range w.atts {
		// A paused holder's connection moves nothing, either way, until
		// it wakes.
		paused := w.pausedNow(a)
		for _, l := range a.feed {
			if l.due(w.tick) {
				dst = append(dst, l)
			}
		}
		if !paused && a.s2d.due(w.tick) {
			dst = append(dst, a.s2d)
		}
		if !paused && a.d2s.due(w.tick) {
			dst = append(dst, a.d2s)
		}
	}
	if w.ghostSrc.due(w.tick) && !w.ghostSrcHeld() {
		dst = append(dst, w.ghostSrc)
	}
	if w.ghostDst.due(w.tick) {
		dst = append(dst, w.ghostDst)
	}
	return dst
}

// stepExecutors runs txns: on the source up to StepsMax, pumping its
// processor between every two as the executor's driver must; on the
// oracle everything ready; on the live destination a random number, so it
// lags and catches up.
func (w *world) stepExecutors() {
	n := 1 + w.net.IntN(w.k.StepsMax)
	w.stepSource(n)
	for {
		if _, ok := w.ref.Step(); !ok {
			break
		}
	}
	if w.live != nil {
		w.dst.Step(w.net.IntN(w.k.StepsMax + 1))
	}
}

// stepSource runs up to n txns on every live source replica and reports
// how many ran on the first. Its core pumps the source processor after
// every txn and once more at the end; the outputs are taken after each
// txn, so a Handoff is recorded where the source sent it.
func (w *world) stepSource(n int) int {
	first := 0
	for i, sr := range w.srcs {
		if sr.out() {
			continue
		}
		ran := 0
		if a := w.srcAttemptOn(sr); a != nil && !a.src.State().Final() && w.pausedNow(a) {
			// A frozen holder's processor does nothing; the executor runs
			// on past it, its gate (the processor) deciding what runs.
			for ; ran < n; ran++ {
				if _, ok := sr.exec.Step(); !ok {
					break
				}
			}
		} else {
			for ; ran < n; ran++ {
				if sr.core.Step(1) == 0 {
					break // Step pumped once, with no txn to run
				}
				w.afterSourceStep(sr)
			}
			if ran == n {
				sr.core.Step(0) // the pump after the last txn
			}
			w.afterSourceStep(sr)
			// A pump that stopped at PumpBlocksMax is pumped again
			// before the world moves on, as the node's loop does before
			// it waits; the window bounds how often.
			for sr.core.SourcePending() {
				w.stats.PumpsCapped++
				sr.core.Step(0)
				w.afterSourceStep(sr)
			}
		}
		if i == 0 {
			first = ran
		}
	}
	return first
}

// afterSourceStep takes what sr's core produced in a step.
func (w *world) afterSourceStep(sr *srcReplica) {
	if a := w.srcAttemptOn(sr); a != nil {
		w.afterCall(a)
		return
	}
	w.drain(sr.core, sr.id)
}

// tickProcessors advances every running processor's clock, old attempts'
// included: a side that has not learned its connection is cut goes on
// running, and its messages may still reach a newer attempt.
func (w *world) tickProcessors() {
	for _, a := range w.atts {
		if a.src != nil && !a.src.State().Final() && !w.pausedNow(a) && !a.sn.dead {
			if a.sn.core.Source() != a.src {
				w.violate("c", "attempt %d's source runs, but not on its node's replica", a.epoch)
			}
			a.sn.core.Tick()
			w.afterCall(a)
			w.watchThrottle(a)
		}
		if a.dstUp() && !a.dst.State().Final() {
			if w.dst.Destination() != a.dst {
				w.violate("c", "attempt %d's destination runs, but not on the node's replica", a.epoch)
			}
			w.dst.Tick()
			w.afterCall(a)
		}
	}
}

// watchThrottle traces when the source's throttle starts and stops
// holding back its execution.
func (w *world) watchThrottle(a *attempt) {
	t := a.src.Metrics().ThrottledTicks
	on := t > a.throttledTicks
	if on != a.throttled {
		if on {
			w.tracef("src e%d throttle engaged", a.epoch)
		} else {
			w.tracef("src e%d throttle released", a.epoch)
		}
		a.throttled = on
	}
	a.throttledTicks = t
}

// maybeFinish ends the run once the feed has stopped and every replica has
// executed all of it, every link is empty and every processor has ended;
// then the final checks run.
func (w *world) maybeFinish() {
	if !w.quiescing || w.tick < w.quietTick+2 {
		return
	}
	if !w.quiet() {
		return
	}
	w.finalCheck()
	w.done = true
}

func (w *world) quiet() bool {
	// A replica that executed the last txn sent has executed every txn:
	// it ran it only once nothing below it could still arrive. Heartbeats
	// keep flowing, so the feed links never empty.
	execs := append(w.liveSources(), w.ref)
	if w.live != nil {
		execs = append(execs, w.live.exec)
	}
	for _, e := range execs {
		if e.LastExecuted() != w.lastTxn || e.Queued() > 0 {
			return false
		}
	}
	for _, a := range w.atts {
		if len(a.s2d.q)+len(a.d2s.q) > 0 {
			return false
		}
		if !a.sn.dead && ((a.src == nil && a.helloErr == nil) || (a.src != nil && !a.src.State().Final())) {
			return false
		}
		if a.dstUp() && !a.dst.State().Final() {
			return false
		}
		if a.x != nil && !a.x.finished && !a.x.dead {
			return false
		}
	}
	if len(w.ghostSrc.q)+len(w.ghostDst.q) > 0 {
		return false
	}
	// A claim whose holder could not give it back (the coordinator did not
	// answer) goes when its lease runs out, at most ClaimTTLTicks from its
	// last keepalive, and the final check wants no claim left. Wait for
	// it, and for the coordinator to be back. Any claim whose holder still
	// believes it holds it at the end is a bug the check reports.
	if w.claims && (w.coord.down(w.tick) || w.dstComplete != nil) {
		return false
	}
	if c := w.coord.claim; w.claims && c != nil {
		if a := w.attemptOf(c.epoch); a != nil && a.x != nil && !a.x.holds {
			return false
		}
	}
	// A lost registration settles before the end: its replica is either
	// compared at the end or out.
	for _, sr := range w.srcs {
		if !sr.dead && sr.unsettled() {
			return false
		}
	}
	if j := w.joiner; j != nil && j.active && !j.core.Fed(w.srcs[w.regPlan.node].id) && !w.srcs[w.regPlan.node].dead {
		return false
	}
	return true
}

func (w *world) result() Result {
	r := Result{Seed: w.seed, Knobs: w.k, Err: w.err, Trace: w.tr.lines, Ticks: w.tick, Attempts: len(w.atts), LiveTick: w.liveTick, Stats: w.stats}
	if live := w.liveSources(); len(live) > 0 {
		r.FinalTxn = live[0].LastExecuted()
		r.FinalDigest = live[0].Partition().Digest()
	}
	for _, a := range w.atts {
		if a.src != nil {
			m := a.src.Metrics()
			r.Stats.StaleRejected += m.StaleRejected
			r.Stats.Rounds = max(r.Stats.Rounds, m.Rounds)
			r.Stats.LogBytesPeak = max(r.Stats.LogBytesPeak, m.LogBytesPeak)
			r.Stats.ThrottledTicks += m.ThrottledTicks
			r.Stats.TxnsHeldForRound += m.Stream.TxnsHeldForRound
		}
		if a.dst != nil {
			m := a.dst.Metrics()
			r.Stats.StaleRejected += m.StaleRejected
			r.Stats.Snapshot += m.Snapshot.Rows
			r.Stats.Deletes += m.Deletes.Rows
			r.Stats.Upserts += m.Upserts.Rows
			r.Stats.TxnsDropped += m.TxnsDropped
		}
	}
	return r
}

// where says where the run stands, for a failure message.
func (w *world) where() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d attempts", len(w.atts))
	if a := w.cur(); a != nil {
		fmt.Fprintf(&b, "; attempt %d: source %s, destination %s", a.epoch, a.srcStateString(), a.dstStateString())
		if a.src != nil && a.src.Err() != nil {
			fmt.Fprintf(&b, " (source: %v)", a.src.Err())
		}
		if a.dst != nil && a.dst.Err() != nil {
			fmt.Fprintf(&b, " (destination: %v)", a.dst.Err())
		}
	}
	return b.String()
}

// violate fails the run: it unwinds to Run, which records the violation.
func (w *world) violate(check, format string, args ...any) {
	panic(&Violation{Tick: w.tick, Check: check, Msg: fmt.Sprintf(format, args...)})
}

// tracer collects the trace: one line per event, the tick first.
type tracer struct {
	on    bool
	lines []string
}

func (w *world) tracef(format string, args ...any) {
	if !w.tr.on {
		return
	}
	w.tr.lines = append(w.tr.lines, fmt.Sprintf("%6d ", w.tick)+fmt.Sprintf(format, args...))
}
