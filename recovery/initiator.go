package recovery

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The initiator core (docs/DESIGN.md "The initiator core"): what a node's
// initiator decides, with no goroutine, socket or wall clock. It assigns
// txn IDs to client calls, sends each txn to the replicas of its partition
// on the nodes it has a feed to, waits for every live one's Done, answers
// the caller, heartbeats idle feeds every BeatTicks ticks, and keeps per
// node the state of its feed there: dialing (its hello sent, its floor not
// yet in), open, lost (it broke; the process it went to may take it up
// again), or none; the txns meant for that node that it has not yet
// acknowledged (the feed's log, sent again when a broken feed resumes:
// docs/DESIGN.md "Feeds that resume"); and the partitions it sequenced a
// txn of while it had no feed there (wire.Hello.Missed). A driver (recovery/node's feed.go) dials, reads and
// writes the feeds, maps its timers to Tick and its membership reads to
// SetView, and hands the core's messages to the feeds through
// InitiatorIO.

// InitiatorIO is what an Initiator needs from its driver. Each method is
// called from within an input (Submit, Tick, Heartbeat, SetView), never
// concurrently with another, and must not call back into the Initiator.
type InitiatorIO interface {
	// Send queues m on the open feed to node, in order, and reports
	// whether it did: false if the feed is broken or its queue full, in
	// which case the driver closes it and reports FeedLost later.
	Send(node string, m wire.Message) bool
	// Dial asks for a feed to node's process d.Inc, with the hello d
	// says. The driver reports FeedOpened, FeedResumed or DialFailed.
	Dial(node string, d DialAsk)
	// Close asks the driver to close the feed to node: it is a stale
	// process's. The driver reports FeedLost once it has ended.
	Close(node string)
}

// DialAsk is what a feed's hello says (wire.Hello).
type DialAsk struct {
	// Inc is the process dialled.
	Inc int64
	// Missed are the partitions whose txns this process sequenced while
	// it had no feed to the node (wire.Hello.Missed).
	Missed []uint32
	// Resume asks the receiver to take up the broken feed before this
	// one: the log holds every txn meant for the node above Kept.
	Resume bool
	Kept   txnid.ID
}

// FeedLogBytesMax is the default bound of one feed's log (InitiatorConfig).
const FeedLogBytesMax = 64 << 20

// InitiatorConfig configures an Initiator.
type InitiatorConfig struct {
	// Node names the initiator's node in its errors.
	Node string
	ID   txnid.Initiator
	// Clock is the ID generator's clock, Unix milliseconds: a txn ID is
	// its initiator's clock reading (txnid.Generator).
	Clock func() int64
	// Partitions is the cluster's partition count.
	Partitions uint32
	// BeatTicks is how many ticks in a row with nothing sent pass
	// before a heartbeat goes out on every open feed.
	BeatTicks int
	// BeatLeadMillis and BeatLeadQuietTicks: once BeatLeadQuietTicks
	// ticks in a row passed with no txn sequenced, each heartbeat stands
	// at least BeatLeadMillis ahead of the clock (the generator moves
	// there first, as for BeatPast), so the replicas of a node that
	// writes run its txns on heartbeats already in hand rather than
	// waiting for this initiator's next one (docs/DESIGN.md "Heartbeats
	// that lead"). 0 for either: heartbeats at the clock.
	BeatLeadMillis     int64
	BeatLeadQuietTicks int
	// FeedLogBytesMax bounds each feed's log, the txns meant for one node
	// that it has not acknowledged (a txn counts its params, its
	// procedure name and 64 bytes); 0 means FeedLogBytesMax. Past it a
	// feed takes no more. Not open, the node misses the txns of the
	// partitions others serve (the next hello names them; their replicas
	// there rejoin), and a call it holds the only live replica of is
	// refused (ErrFeedLogFull). Open, it cannot be told what it missed,
	// so a call that would reach it is refused.
	FeedLogBytesMax int
	// Joins: the initiator joins a partition on a feed (wire.Join) and
	// sends its txns there only once the receiver answered (Joined), so
	// a replica tracks only the initiators that joined its partition,
	// not every initiator with a feed to its node (docs/DESIGN.md
	// "Sequencers per partition"). Off: every feed's receiver tracks the
	// initiator in every replica it hosts from the feed's floor on.
	Joins bool
	// CallTicks bounds how many ticks a call waits for its replicas'
	// results (the first tick may come at once after it was sequenced):
	// past it the call is answered as of unknown outcome, naming
	// the replicas that did not answer and the state of the feed to each
	// (Expired lists it for the driver's log). Every rule above ends a
	// wait on a replica that will not answer; this bound is what a caller
	// is owed should one of them not hold. 0: no bound.
	CallTicks int
	// Knobs are testing hooks, off when nil.
	Knobs InitiatorKnobs
}

// ExpiredCall is a call answered because it waited CallTicks for its
// replicas (InitiatorConfig.CallTicks).
type ExpiredCall struct {
	Partition uint32
	ID        txnid.ID
	// Waited says, per node whose replica did not answer, the feed's
	// state there, e.g. "n3 (feed open)".
	Waited []string
	// Millis is how long it waited, by the initiator's clock.
	Millis int64
}

// expiredMax bounds the expired calls kept for the driver (Expired).
const expiredMax = 64

// InitiatorKnobs are an Initiator's fault points for tests.
type InitiatorKnobs struct {
	// SkipSend keeps a txn or heartbeat id from being sent to node, as if
	// lost on the way; the call does not wait for the node.
	SkipSend func(node string, id txnid.ID) bool
	// Plant may change a txn before it is sent (a planted fault).
	Plant func(*wire.Txn)
}

// InitiatorView is the initiator's membership view: what the cluster's
// coordinator said at the driver's last read.
type InitiatorView struct {
	// Nodes are the nodes alive, each with its process's incarnation.
	Nodes map[string]int64
	// Placement holds each partition's replicas.
	Placement map[uint32][]ReplicaPlace
	// Bootstrapped: every node of the placement has started once, so
	// calls may be taken.
	Bootstrapped bool
}

// ReplicaPlace is one replica of a partition in an InitiatorView.
type ReplicaPlace struct {
	Node string
	// Live: the replica is live (not rejoining, not failed).
	Live bool
	// Rev changes with every state its node publishes for it (the
	// record's etcd revision; 0 where nothing publishes). A replica
	// that failed and came back live between two views is another
	// replica: the txns it had not run died with it, and it answers
	// none of them.
	Rev int64
}

// UnfedError refuses a call whose partition has a replica on a node the
// initiator has no feed to (Unfed). Nothing was sent: a definite failure.
type UnfedError struct {
	Partition uint32
	Nodes     []string
	// Joining: the feeds there are open, and the partition's join on
	// them not answered yet (InitiatorConfig.Joins).
	Joining bool
}

func (e *UnfedError) Error() string {
	if e.Joining {
		return fmt.Sprintf("partition %d: %s, which holds a replica of it, has not answered this initiator's join yet: the txn was sent nowhere", e.Partition, strings.Join(e.Nodes, ", "))
	}
	return fmt.Sprintf("partition %d: no feed open to %s, which holds a replica of it: the txn was sent nowhere", e.Partition, strings.Join(e.Nodes, ", "))
}

// feedState is the state of an initiator's feed to one node.
type feedState int

const (
	// feedDialing: asked of the driver, its floor not yet in. Nothing is
	// sent on it, and no txn of the node's partitions is sequenced, so
	// its hello's Missed stays whole.
	feedDialing feedState = iota
	// feedOpen: its floor came in; txns and heartbeats go out on it.
	feedOpen
	// feedLost: it broke while the process it went to may live on. Txns
	// meant for the node go into its log, and the calls wait for its
	// replicas as before: the feed resumes (FeedResumed) and sends them,
	// or the node's replica stops counting (dead, not live, a new
	// process), or the receiver refuses to resume and fails its replicas.
	feedLost
)

type feedOut struct {
	state feedState
	// inc is the process the feed was dialled to: the same process
	// across its re-registrations.
	inc int64
	// fresh: nothing was sent on it since it opened. The next tick
	// heartbeats it, so the replicas there, which track this initiator
	// from the floor on and run nothing past what they have until it
	// speaks, hear from it within a tick.
	fresh bool
	// beatTop is the highest heartbeat ID sent on it (BeatPast).
	beatTop txnid.ID
	// resume: the dial under way asks to take up a broken feed, so txns
	// go into the log meanwhile and the node counts as fed.
	// missedOnDial: a txn was missed there (its log full) after that
	// dial's hello named what was missed: the resume must not go ahead.
	resume, missedOnDial bool
	// log holds, in ID order, every txn meant for the node above kept
	// that the node has not acknowledged (wire.FeedAck), sent or not;
	// logBytes is its size as FeedLogBytesMax counts it. Of a process:
	// a new process of the node starts an empty one.
	log      []*wire.Txn
	logBytes int
	kept     txnid.ID
	// joined are the partitions the receiver answered this process's
	// join of, joining those asked and not answered (Joins). A new feed
	// starts with none; a resumed one keeps joined, as its receiver
	// does, and asks again what was joining.
	joined, joining map[uint32]bool
}

// txnLogBytes is what one txn counts in a feed's log.
func txnLogBytes(t *wire.Txn) int { return logBytes(t.Proc, t.Params) }

// logBytes is what a txn of proc and params counts in a feed's log.
func logBytes(proc string, params []byte) int { return len(params) + len(proc) + 64 }

// full reports whether a txn of n log bytes would overflow the log. A
// full log takes no more, open or not: its txns are all the node may
// still lack, and one dropped would fail the node's replicas should the
// feed break before they arrived, the partition's last live copy among
// them (the simulator, seed 2031481811: an open feed's small log dropped
// txns sent and not yet acknowledged, broke, and the only live replica
// failed on the resume it could not take).
func (f *feedOut) full(n, max int) bool {
	return f.logBytes+n > max
}

// push adds t to the log.
func (f *feedOut) push(t *wire.Txn) {
	f.log = append(f.log, t)
	f.logBytes += txnLogBytes(t)
}

// ack drops the log's txns at or below id: the node has them.
func (f *feedOut) ack(id txnid.ID) {
	i := 0
	for i < len(f.log) && f.log[i].ID <= id {
		f.logBytes -= txnLogBytes(f.log[i])
		f.log[i] = nil
		i++
	}
	f.log = f.log[i:]
	if len(f.log) == 0 {
		f.log, f.logBytes = nil, 0
	}
	f.kept = max(f.kept, id)
}

// pendingCall is one call in flight.
type pendingCall struct {
	req *wire.Call
	id  txnid.ID
	// waiting are the nodes whose replica's Done the call waits for:
	// live replicas whose feed took the txn or whose log holds it, each
	// with its ReplicaPlace.Rev when the call was sequenced.
	// Invariant: a node leaves it only by its Done, its death, a new
	// process of it, its replica no longer live or live again since
	// (another Rev), or its feed resumed above the txn (the Done was
	// lost with the connection; the txn is there) or refused to resume
	// (its replicas there failed).
	waiting map[string]int64
	// sent: the txn went out on at least one feed, so without a result
	// its outcome is unknown, not a failure.
	sent bool
	// unsure: a node it waited for broke its feed and did not take it up
	// again; what its replicas hold now is not known here, so the call's
	// outcome is unknown whatever the others answer. Or two replicas
	// answered differently (OnDone).
	unsure  string
	replied bool
	// first is the node whose Done is the reply.
	first string
	reply wire.Reply
	send  func(*wire.Reply)
	// tick and at are when it was sequenced: the initiator's tick count
	// and clock (CallTicks).
	tick int64
	at   int64
}

// Initiator is the pure core of a node's initiator. It is not safe for
// concurrent use: the driver serializes its inputs.
type Initiator struct {
	cfg InitiatorConfig
	io  InitiatorIO
	gen *txnid.Generator
	// feeds holds a node's entry from the dial asked until a fresh dial
	// failed or the node's process changed; a broken feed stays, lost,
	// with its log, and no second feed is dialled while one is dialing.
	feeds map[string]*feedOut
	// missed holds, per node, the partitions sequenced while it had no
	// feed: told in the hello of the next feed there (wire.Hello.Missed).
	missed map[string]map[uint32]bool
	// pending are the calls in flight with a caller. Its bound is the
	// driver's: recovery/node admits a client's calls within
	// ClientBytesMax per connection and ConnsMax connections.
	pending map[txnid.ID]*pendingCall
	// feedsScratch and targetsScratch are Submit's, kept so that a call
	// allocates only its txn (and, with a caller, its wait).
	feedsScratch   []ReplicaFeed
	targetsScratch []ReplicaPlace
	// idle counts the ticks in a row in which nothing was sent; sent
	// says a txn went out since the last tick. quiet counts the ticks
	// since a txn was sequenced, heartbeats or not (BeatLeadQuietTicks).
	idle  int
	quiet int
	sent  bool
	// fenced: a node took this process for dead (Fenced).
	fenced bool
	// ticks counts Tick's calls; calls holds the calls with a caller in
	// the order they were sequenced, answered ones among them until they
	// reach its front, for CallTicks; expired are those CallTicks ended,
	// until the driver takes them (Expired).
	ticks   int64
	calls   []*pendingCall
	expired []ExpiredCall
	// active are the partitions this process joins (Joins): those its
	// node holds a replica of in a view, and those it sequenced. It
	// joins them on every feed to a node holding one of their replicas,
	// so a replica placed later or a node restarted tracks it too. Left
	// untracked there, it would never hear this initiator, and a
	// rejoin's handoff, which names every initiator its source tracks,
	// would find it uncovered at each attempt. A partition stays active
	// once it was: the replicas that track the process do so until it
	// ends.
	active map[uint32]bool
}

// BeatPastAheadMillisMax bounds how far ahead of an initiator's clock an
// ID given to BeatPast may be, in the clock's milliseconds.
const BeatPastAheadMillisMax = 60_000

// NewInitiator returns an Initiator with no feed.
func NewInitiator(cfg InitiatorConfig, io InitiatorIO) (*Initiator, error) {
	if cfg.BeatTicks < 1 {
		return nil, fmt.Errorf("%w: initiator BeatTicks %d, want >= 1", ErrConfig, cfg.BeatTicks)
	}
	if cfg.Clock == nil {
		return nil, fmt.Errorf("%w: initiator without a clock", ErrConfig)
	}
	gen, err := txnid.NewGenerator(cfg.ID, cfg.Clock)
	if err != nil {
		return nil, fmt.Errorf("recovery: %w", err)
	}
	if cfg.FeedLogBytesMax <= 0 {
		cfg.FeedLogBytesMax = FeedLogBytesMax
	}
	return &Initiator{cfg: cfg, io: io, gen: gen, feeds: map[string]*feedOut{},
		missed: map[string]map[uint32]bool{}, pending: map[txnid.ID]*pendingCall{}, active: map[uint32]bool{}}, nil
}

// Pending is the number of calls in flight.
func (in *Initiator) Pending() int { return len(in.pending) }

// Unfed returns the nodes a txn of p waits for a feed to (Unfed): while
// any, Submit refuses the call. A driver may wait, boundedly, for them.
func (in *Initiator) Unfed(v *InitiatorView, p uint32) []string {
	return Unfed(in.replicaFeeds(p, v))
}

// RefusedError is a refusal of Submit that the node passes on to its
// client as such (wire.Reply.Refused), with nothing sequenced.
type RefusedError struct {
	Refused wire.Refusal
	Text    string
}

func (e *RefusedError) Error() string { return e.Text }

// ErrNoLiveReplica refuses a call whose partition has no replica the
// initiator may count on: none live in its view with a feed that takes
// the txn. Nothing was sent.
var ErrNoLiveReplica = errors.New("no live replica")

// ErrFeedLogFull refuses a call whose txn a feed's full log cannot take:
// the partition's only live replicas are behind feeds that broke, where
// a txn past the bound would be missed and fail the partition's last
// live copies, or a replica is behind an open feed whose node has not
// acknowledged a log's worth of txns, where a txn missed could not be
// named. Nothing was sent.
var ErrFeedLogFull = errors.New("a feed's log is full: nothing was sent")

// Submit sequences a call and sends its txn to every replica of its
// partition on a node with an open feed; reply gets the answer once no
// live replica is waited for. registered says whether the node holds its
// registration: without it the view may be stale and others may take the
// node for dead, so a call sequenced now could miss a replica gone live
// meanwhile (docs/DESIGN.md "Without the coordinator"). An error refuses
// the call with nothing sent, and reply is not called. A nil reply: no
// caller waits (a workload of the simulator or the bench), and the call
// is not kept once sent.
func (in *Initiator) Submit(v *InitiatorView, registered bool, req *wire.Call, reply func(*wire.Reply)) error {
	if !registered {
		return &RefusedError{wire.RefusedNotRegistered, fmt.Sprintf("node %s is not registered in etcd (coordinator unreachable): it sequences no call until it is", in.cfg.Node)}
	}
	if req.Partition >= in.cfg.Partitions {
		return fmt.Errorf("partition %d out of range (%d partitions)", req.Partition, in.cfg.Partitions)
	}
	if !v.Bootstrapped {
		// A node of the placement has never started: its replicas will
		// come up live and empty, so nothing may be written before.
		return &RefusedError{wire.RefusedNotBootstrapped, "the cluster is not bootstrapped yet: a node of its placement has never started"}
	}
	feeds := in.replicaFeedsInto(in.feedsScratch[:0], req.Partition, v)
	in.feedsScratch = feeds
	if unfed := Unfed(feeds); len(unfed) > 0 {
		// A replica there would never get the txn and, not tracking
		// this initiator, would run past it (docs/DESIGN.md "Feeds that
		// open late").
		return &UnfedError{Partition: req.Partition, Nodes: unfed}
	}
	if in.cfg.Joins {
		if unjoined := in.join(req.Partition, v); len(unjoined) > 0 {
			return &UnfedError{Partition: req.Partition, Nodes: unjoined, Joining: true}
		}
	}
	targets, live := in.targetsScratch[:0], 0
	for _, rp := range v.Placement[req.Partition] {
		if in.logs(rp.Node, v) {
			targets = append(targets, rp)
			// A node out of the view whose replica has not answered the
			// join is sent the txn, which its replica, not tracking this
			// initiator, refuses and fails on (join): it is no copy to
			// count on, and if it holds the partition's only live
			// replica, the call is refused rather than that replica lost.
			if rp.Live && (!in.cfg.Joins || in.feeds[rp.Node].joined[req.Partition]) {
				live++
			}
		}
	}
	in.targetsScratch = targets
	if live == 0 {
		return fmt.Errorf("partition %d has %w", req.Partition, ErrNoLiveReplica)
	}
	// A feed that is not open logs the txn only while its log has room.
	// A node whose log is full misses the txn, and its replica fails when
	// the feed opens again (the hello names the partition missed): the
	// other live replicas answer the call. Where no other live replica
	// would take it, the call is refused instead: the replica behind that
	// feed is the partition's only live copy, and a network fault must
	// not fail it (the simulator, seed 3014971: a small log overflowed
	// into the only live replica, which then failed for txns acknowledged
	// nowhere, and the partition was lost).
	//
	// An open feed whose log is full cannot miss the txn: nothing would
	// tell the node, whose replicas would run past it. The node is
	// behind by a log's worth of acknowledgements (stopped, or its
	// connection stalled). While the view has it alive, the call is
	// refused until it catches up. Once taken for dead, it is not waited
	// for, and its feed is closed as a dead process's would be: the rule
	// above applies, and the hello of a redial once it is back names
	// what it missed. Left open, a process stopped past its fence would
	// refuse its partitions' calls for as long as it stays stopped.
	n, counted := logBytes(req.Proc, req.Params), live
	for _, rp := range targets {
		f := in.feeds[rp.Node]
		if !f.full(n, in.cfg.FeedLogBytesMax) {
			continue
		}
		if f.state == feedOpen {
			if _, alive := v.Nodes[rp.Node]; alive {
				return fmt.Errorf("partition %d: node %s has not acknowledged %d bytes of txns on its open feed: %w", req.Partition, rp.Node, f.logBytes, ErrFeedLogFull)
			}
			in.io.Close(rp.Node)
			f.state = feedLost
		}
		if rp.Live && (!in.cfg.Joins || f.joined[req.Partition]) {
			counted--
		}
	}
	if counted == 0 {
		return fmt.Errorf("partition %d: its live replicas' feeds are down and their logs full: %w", req.Partition, ErrFeedLogFull)
	}
	id := in.gen.Next()
	var c *pendingCall
	if reply != nil {
		c = &pendingCall{req: req, id: id, waiting: make(map[string]int64, live), send: reply, tick: in.ticks}
		if in.cfg.CallTicks > 0 {
			c.at = in.cfg.Clock()
			in.calls = append(in.calls, c)
		}
		for _, rp := range targets {
			if rp.Live {
				c.waiting[rp.Node] = rp.Rev
			}
		}
		in.pending[id] = c
	}
	for _, r := range feeds {
		if !r.Fed { // Missed
			in.noteMissed(r.Node, req.Partition)
		}
	}
	txn := &wire.Txn{Partition: req.Partition, ID: id, Proc: req.Proc, Params: req.Params}
	if in.cfg.Knobs.Plant != nil {
		in.cfg.Knobs.Plant(txn)
	}
	for _, rp := range targets {
		f := in.feeds[rp.Node]
		if full := f.full(n, in.cfg.FeedLogBytesMax); full || in.skip(rp.Node, id) {
			if full {
				in.noteMissed(rp.Node, req.Partition)
				f.missedOnDial = f.missedOnDial || f.resume
			}
			if c != nil {
				delete(c.waiting, rp.Node)
			}
			continue
		}
		// Logged first: a send that fails breaks the feed, and the txn
		// goes out again when it resumes.
		f.push(txn)
		if f.state == feedOpen {
			in.send(rp.Node, txn)
		}
		if c != nil {
			c.sent = true
		}
	}
	in.sent = true
	if c != nil {
		in.maybeReply(c)
	}
	return nil
}

// send sends m on the open feed to node.
func (in *Initiator) send(node string, m wire.Message) bool {
	if !in.io.Send(node, m) {
		return false
	}
	in.feeds[node].fresh = false
	return true
}

func (in *Initiator) skip(node string, id txnid.ID) bool {
	return in.cfg.Knobs.SkipSend != nil && in.cfg.Knobs.SkipSend(node, id)
}

func (in *Initiator) open(node string) bool {
	f := in.feeds[node]
	return f != nil && f.state == feedOpen
}

// logs reports whether a txn meant for node goes into its feed's log
// now: the feed is open, or it broke (or is being taken up again) while
// the process it went to lives in v, and no node has fenced this process.
func (in *Initiator) logs(node string, v *InitiatorView) bool {
	f := in.feeds[node]
	if f == nil {
		return false
	}
	if f.state == feedOpen {
		return true
	}
	if in.fenced {
		return false
	}
	inc, alive := v.Nodes[node]
	return alive && inc == f.inc && (f.state == feedLost || f.resume)
}

// replicaFeeds says, for each replica of p, whether its node is alive in
// v and whether a txn sent now reaches it: the feed to it is open, or the
// one to its process broke and its log keeps the txn until it resumes
// (its replicas track this initiator meanwhile and run nothing past it).
func (in *Initiator) replicaFeeds(p uint32, v *InitiatorView) []ReplicaFeed {
	return in.replicaFeedsInto(nil, p, v)
}

// replicaFeedsInto is replicaFeeds appending to rs.
func (in *Initiator) replicaFeedsInto(rs []ReplicaFeed, p uint32, v *InitiatorView) []ReplicaFeed {
	for _, rp := range v.Placement[p] {
		_, alive := v.Nodes[rp.Node]
		f := in.feeds[rp.Node]
		fed := in.logs(rp.Node, v)
		rs = append(rs, ReplicaFeed{Node: rp.Node, Alive: alive, Fed: fed, Dialing: !fed && f != nil && f.state == feedDialing})
	}
	return rs
}

// join makes p one this process sequences and asks each node holding a
// replica of p, whose feed takes p's txns now, to track it for p
// (wire.Join), once per feed; it returns the nodes alive in v whose
// answer is not in yet. A feed that broke asks when it resumes.
//
// A node the view no longer has is asked too but not waited for, as
// Unfed waits for no dead node: its feed may stay open while its
// process is stopped (a paused process keeps its connections), and a
// join asked just before the pause is never answered. Waited for, the
// partition sequenced nothing until the process woke, however long
// after its fence (the simulator, joins on: a source node that died
// with its feeds open held every initiator's txns for the rest of the
// run). A txn sent there while the join is not answered reaches a
// replica that does not track this initiator, which refuses it and
// fails (partition.Executor.Offer): that node is out of the view, and
// its replica no longer a copy.
func (in *Initiator) join(p uint32, v *InitiatorView) []string {
	in.active[p] = true
	var unjoined []string
	for _, rp := range v.Placement[p] {
		if !in.logs(rp.Node, v) {
			continue // not fed: Unfed's to refuse, or a dead node's
		}
		f := in.feeds[rp.Node]
		if f.joined[p] {
			continue
		}
		if f.state == feedOpen && !f.joining[p] && in.send(rp.Node, &wire.Join{Partition: p}) {
			if f.joining == nil {
				f.joining = map[uint32]bool{}
			}
			f.joining[p] = true
		}
		if _, alive := v.Nodes[rp.Node]; alive {
			unjoined = append(unjoined, rp.Node)
		}
	}
	return unjoined
}

// Joined: the receiver on node answered this process's join of p on the
// open feed there: its replica of p tracks this initiator and executed
// nothing above floor, so the IDs issued from now on go above it.
func (in *Initiator) Joined(node string, p uint32, floor txnid.ID) {
	f := in.feeds[node]
	if f == nil || f.state != feedOpen || !f.joining[p] {
		return // an answer to an earlier feed's join, asked again since
	}
	delete(f.joining, p)
	if f.joined == nil {
		f.joined = map[uint32]bool{}
	}
	f.joined[p] = true
	in.gen.Advance(floor)
}

// noteMissed records that node's replica of p lacks a txn this process
// sequenced.
func (in *Initiator) noteMissed(node string, p uint32) {
	ps := in.missed[node]
	if ps == nil {
		ps = map[uint32]bool{}
		in.missed[node] = ps
	}
	ps[p] = true
}

// OnDone records one replica's result, from node.
func (in *Initiator) OnDone(node string, d *wire.Done) {
	c := in.pending[d.ID]
	if c == nil || !c.waits(node) {
		return // a replica not waited for (rejoining), or a late answer
	}
	delete(c.waiting, node)
	switch {
	case !c.replied:
		c.replied, c.first = true, node
		c.reply.Out = append([]byte(nil), d.Out...)
		c.reply.Err = d.Err
	case !c.req.Each && c.unsure == "" && (!bytes.Equal(c.reply.Out, d.Out) || c.reply.Err != d.Err):
		// The same txn on the same history answers the same: one of
		// the two ran a txn before it that the other never got, and
		// which of them the cluster keeps is not known here. The first
		// answer alone was the reply: a read through n1 returned an
		// uncertain write that only n5, cut off, had run before it,
		// while n1, which ran on without it once it took n5 for dead,
		// answered the next read with the value before (rejoin chaos
		// --net-faults on --seed 406596625, 3m: register 006 not
		// linearizable). A call with Each returns every answer, for its
		// caller to compare.
		c.unsure = fmt.Sprintf("replicas on %s and %s answered differently (one ran a txn the other did not get): the txn's outcome is unknown", c.first, node)
	}
	if c.req.Each {
		c.reply.Each = append(c.reply.Each, wire.ReplicaOut{Node: node, Out: append([]byte(nil), d.Out...), Err: d.Err})
	}
	in.maybeReply(c)
}

// dropNode stops waiting for node.
func (in *Initiator) dropNode(node string) {
	for _, id := range in.pendingIDs() {
		if c := in.pending[id]; c.waits(node) {
			delete(c.waiting, node)
			in.maybeReply(c)
		}
	}
}

// waits reports whether c waits for node's Done.
func (c *pendingCall) waits(node string) bool {
	_, ok := c.waiting[node]
	return ok
}

// pendingIDs lists the calls in flight in ID order, so that replies go
// out in an order that does not depend on a map's.
func (in *Initiator) pendingIDs() []txnid.ID {
	ids := make([]txnid.ID, 0, len(in.pending))
	for id := range in.pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// dropNotLive stops waiting for the replicas v no longer has live: a
// replica that failed (needs a rejoin) drops its feed and will not
// answer, though its node lives (e.g. one failed after a lapsed
// registration, docs/DESIGN.md "Without the coordinator"). The call's
// other live replicas hold the txn. Nor does a replica live again
// under another Rev answer: one that failed and was rebuilt between
// two views, never seen failed here, lost the txns it had not run or
// took them from its source's snapshot, and waited for, it would hold
// its callers until they hung up. A fenced node that comes back has its
// replicas failed and rebuilt in 75 to 110 ms, within a view poll
// (TestFencedNodeBackMidRepair).
func (in *Initiator) dropNotLive(v *InitiatorView) {
	for _, id := range in.pendingIDs() {
		c := in.pending[id]
		changed := false
		for node, rev := range c.waiting {
			if !slices.ContainsFunc(v.Placement[c.req.Partition], func(rp ReplicaPlace) bool { return rp.Node == node && rp.Live && rp.Rev == rev }) {
				delete(c.waiting, node)
				changed = true
			}
		}
		if changed {
			in.maybeReply(c)
		}
	}
}

// maybeReply answers the caller once nothing is waited for.
func (in *Initiator) maybeReply(c *pendingCall) {
	if len(c.waiting) > 0 {
		return
	}
	delete(in.pending, c.id)
	r := c.reply
	r.Req, r.ID = c.req.Req, c.id
	switch {
	case c.unsure != "":
		r.Out, r.Each = nil, nil
		r.Err, r.Uncertain = c.unsure, true
	case c.replied:
	case c.sent:
		// Every replica it was sent to was lost before answering: it may
		// have run on some of them. Only the client can decide what to do.
		r.Err, r.Uncertain = "no live replica answered: the txn's outcome is unknown", true
	default:
		r.Err = "the txn reached no live replica"
	}
	c.send(&r)
}

// Tick advances the heartbeat schedule: after BeatTicks ticks in a row in
// which nothing was sent, a heartbeat goes out on every open feed, so the
// replicas' safe point moves on an idle feed; a feed opened since the
// last tick with nothing sent on it yet gets one at once.
func (in *Initiator) Tick() {
	in.ticks++
	in.expire()
	due := false
	if in.sent {
		in.sent, in.idle, in.quiet = false, 0, 0
	} else {
		in.idle++
		in.quiet++
		due = in.idle >= in.cfg.BeatTicks
	}
	var to []string
	for node, f := range in.feeds {
		if f.state == feedOpen && (due || f.fresh) {
			to = append(to, node)
		}
	}
	if len(to) == 0 {
		return
	}
	in.lead()
	in.beat(to)
	if due {
		in.idle = 0
	}
}

// expire answers the calls that waited CallTicks for their replicas.
// Calls are sequenced in tick order, so only the front of calls can be
// due; an answered call leaves it when it reaches the front.
func (in *Initiator) expire() {
	if in.cfg.CallTicks <= 0 {
		return
	}
	for len(in.calls) > 0 {
		c := in.calls[0]
		if in.pending[c.id] == c {
			if in.ticks-c.tick < int64(in.cfg.CallTicks) {
				return
			}
			waited := make([]string, 0, len(c.waiting))
			for _, node := range sortedKeys(c.waiting) {
				waited = append(waited, fmt.Sprintf("%s (%s)", node, in.feedSays(node)))
			}
			ms := in.cfg.Clock() - c.at
			if len(in.expired) < expiredMax {
				in.expired = append(in.expired, ExpiredCall{Partition: c.req.Partition, ID: c.id, Waited: waited, Millis: ms})
			}
			c.unsure = fmt.Sprintf("partition %d: no answer to txn %v within %d ms from the replica on %s: the txn's outcome is unknown",
				c.req.Partition, c.id, ms, strings.Join(waited, ", "))
			clear(c.waiting)
			in.maybeReply(c)
		}
		in.calls[0] = nil
		in.calls = in.calls[1:]
	}
	in.calls = nil // all answered: let the array go
}

// feedSays describes the feed to node, for an expired call's error.
func (in *Initiator) feedSays(node string) string {
	f := in.feeds[node]
	switch {
	case f == nil:
		return "no feed"
	case f.state == feedOpen:
		return fmt.Sprintf("feed open, %d txns not acknowledged", len(f.log))
	case f.state == feedLost:
		return fmt.Sprintf("feed broken, %d txns kept for it", len(f.log))
	case f.resume:
		return "feed broken, being taken up again"
	default:
		return "feed dialing"
	}
}

// Expired returns the calls CallTicks ended since the last call, at most
// expiredMax of them, for the driver to log.
func (in *Initiator) Expired() []ExpiredCall {
	e := in.expired
	in.expired = nil
	return e
}

// lead moves the generator BeatLeadMillis ahead of the clock if the
// initiator has been quiet for BeatLeadQuietTicks, so the heartbeat that
// follows promises nothing below that point. Only a quiet initiator
// leads: the IDs of one that writes stay at its clock, below what the
// quiet ones promised, so its txns run wherever they land without a
// heartbeat of theirs to wait for. One that leads and then writes
// starts its IDs at its last promise; its txns wait there for the
// others to pass it (BeatPast), as txns of a clock running ahead do,
// until its clock catches up. A clock reading the ID layout cannot
// hold leaves the generator where it is.
func (in *Initiator) lead() {
	ms := in.cfg.BeatLeadMillis
	if ms <= 0 || in.cfg.BeatLeadQuietTicks <= 0 || in.quiet < in.cfg.BeatLeadQuietTicks {
		return
	}
	now := in.cfg.Clock() - txnid.EpochUnixMillis
	if now < 0 || now > txnid.MillisMax-ms {
		return
	}
	in.gen.Advance(txnid.Make(now+ms, 0, 0))
}

// Heartbeat sends a heartbeat on every open feed now, whatever the
// schedule: a driver that stops its txns and lets every replica run to
// the end (the simulator's quiescence and its scripts).
func (in *Initiator) Heartbeat() {
	var to []string
	for node, f := range in.feeds {
		if f.state == feedOpen {
			to = append(to, node)
		}
	}
	in.beat(to)
	in.sent, in.idle = false, 0
}

// BeatPast sends a heartbeat above id now on every open feed that has not
// had one above it yet: another initiator sequenced txns up to id,
// and the replicas that got them run them only once every initiator they
// track passed them (docs/DESIGN.md "Heartbeats on demand"). The ID
// generator first moves above id, as for a feed's floor, so the
// heartbeat passes id whatever this node's clock reads; an id at or
// below what this initiator issued changes nothing but the heartbeat.
// The periodic schedule is left as it is. An id more than BeatPastAheadMillisMax
// ahead of this initiator's clock is ignored: a clock that far off is the
// operator's to fix, and an ID near the end of the ID space would use it
// up. BeatPast only ever adds a heartbeat, so ignoring one costs latency,
// never order.
func (in *Initiator) BeatPast(id txnid.ID) {
	if id.UnixMillis()-in.cfg.Clock() > BeatPastAheadMillisMax {
		return
	}
	var to []string
	for node, f := range in.feeds {
		if f.state == feedOpen && f.beatTop < id {
			to = append(to, node) // a feed opened since the last heartbeat too
		}
	}
	if len(to) == 0 {
		return
	}
	in.gen.Advance(id)
	in.beat(to)
}

// beat sends one heartbeat to the nodes to, in name order; it takes an ID
// even with none to send to.
func (in *Initiator) beat(to []string) {
	slices.Sort(to)
	b := &wire.Beat{ID: in.gen.Next()}
	for _, node := range to {
		if in.skip(node, b.ID) {
			continue
		}
		if in.send(node, b) { // a failed send closes the feed: FeedLost follows
			in.feeds[node].beatTop = b.ID
		}
	}
}

// Last is the last txn or heartbeat ID issued.
func (in *Initiator) Last() txnid.ID { return in.gen.Last() }

// Fed reports whether the feed to node is open.
func (in *Initiator) Fed(node string) bool { return in.open(node) }

// SetView takes a new membership view: it stops waiting for nodes taken
// for dead and replicas no longer live, closes feeds to a stale process
// of a node, drops the log of a process replaced, and asks for a feed to
// every node alive that has none open: a fresh one, or one that takes up
// the broken feed to the same process.
func (in *Initiator) SetView(v *InitiatorView) {
	for _, node := range sortedKeys(in.feeds) {
		f := in.feeds[node]
		inc, ok := v.Nodes[node]
		switch {
		case !ok:
			// Taken for dead by the coordinator: stop waiting for it, but
			// keep its feed and its log. A dead process's connection
			// breaks by itself; a process that only lost the coordinator
			// goes on receiving every txn, so it misses none
			// (docs/DESIGN.md "Without the coordinator").
			in.dropNode(node)
		case inc != f.inc && f.state == feedOpen:
			in.io.Close(node) // a new process: the old connection is stale
		case inc != f.inc && f.state == feedLost:
			// A new process: the old one's replicas are gone with it, and
			// so is any use of its log.
			delete(in.feeds, node)
			in.dropNode(node)
		}
	}
	in.dropNotLive(v)
	if in.cfg.Joins {
		// A holder joins its partitions before any call: a replica that
		// tracks no initiator cannot rejoin (its proposal waits for one),
		// and one whose partition no node wrote to since a restart would
		// never hear any.
		for p, rps := range v.Placement {
			if slices.ContainsFunc(rps, func(rp ReplicaPlace) bool { return rp.Node == in.cfg.Node }) {
				in.active[p] = true
			}
		}
		for _, p := range slices.Sorted(maps.Keys(in.active)) {
			in.join(p, v)
		}
	}
	for _, node := range sortedKeys(v.Nodes) {
		f := in.feeds[node]
		switch {
		case f == nil:
			// What node missed so far goes in the hello; from here until
			// the feed is open no txn of its partitions is sequenced
			// (Dialing), so the list stays whole.
			in.feeds[node] = &feedOut{state: feedDialing, inc: v.Nodes[node]}
			in.io.Dial(node, DialAsk{Inc: v.Nodes[node], Missed: in.Missed(node)})
		case f.state == feedLost:
			// The same process: ask it to take the feed up where it
			// stopped. The log goes on taking txns meanwhile.
			f.state, f.resume, f.missedOnDial = feedDialing, true, false
			in.io.Dial(node, DialAsk{Inc: f.inc, Missed: in.Missed(node), Resume: true, Kept: f.kept})
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// FeedOpened: the feed to node is up and its receiver's floor came in,
// the highest txn ID its replicas executed before they began to track
// this initiator. Every ID issued from now on lies above it
// (docs/DESIGN.md "An initiator that joins"), and the next tick
// heartbeats the feed if nothing went out on it before, so the replicas'
// safe point hears from this initiator within a tick.
//
// A floor in answer to a dial that asked to resume says the receiver
// did not take up the broken feed: what the log held will never reach
// it, and its replicas failed or no longer wait for this initiator. The
// calls that waited for it stop, each answered as of unknown outcome:
// this initiator cannot tell whether what the others answered stands
// (docs/DESIGN.md "Feeds that resume"). The log starts anew.
func (in *Initiator) FeedOpened(node string, floor txnid.ID) {
	f := in.feeds[node]
	if f == nil || f.state != feedDialing {
		panic(fmt.Sprintf("recovery: feed to %s opened without a dial", node))
	}
	if f.resume {
		for _, id := range in.pendingIDs() {
			if c := in.pending[id]; c.waits(node) {
				c.unsure = fmt.Sprintf("the feed to %s broke and %s did not take it up again: the txn's outcome is unknown", node, node)
				delete(c.waiting, node)
				in.maybeReply(c)
			}
		}
	}
	f.state, f.fresh, f.resume, f.beatTop = feedOpen, true, false, txnid.Zero
	f.log, f.logBytes, f.kept = nil, 0, txnid.Zero
	f.joined, f.joining = nil, nil // a new feed: its receiver tracks nothing of it
	delete(in.missed, node)        // the node has the list now
	in.gen.Advance(floor)
}

// FeedResumed: the receiver took up the broken feed to node where it
// stopped, at its ID at: every txn of this process up to at is there.
// What the log holds above it goes out again, in order, before anything
// new. A call that waits for the node with its txn at or below at lost
// its Done with the connection: the txn is there, so it stops waiting.
//
// The hello named what the node missed when the dial went out; the log
// takes txns until the answer, and once full it misses the node the
// txns meant for it (Submit). Then the feed is closed with nothing sent,
// and the next dial's hello names those partitions too: the receiver
// resumes and fails only their replicas. Before, a full log dropped its
// oldest, above the hello's Kept, and the receiver, refused the next
// resume, failed every replica (simulator seed 5238).
func (in *Initiator) FeedResumed(node string, at txnid.ID) {
	f := in.feeds[node]
	if f == nil || f.state != feedDialing || !f.resume {
		panic(fmt.Sprintf("recovery: feed to %s resumed without a dial to resume", node))
	}
	f.state, f.fresh, f.resume, f.beatTop = feedOpen, true, false, txnid.Zero
	// A join asked on the broken connection may have been answered
	// there: it is asked again, and the receiver answers it again.
	f.joining = nil
	if f.kept > at || f.missedOnDial {
		in.io.Close(node)
		return
	}
	delete(in.missed, node) // the hello named them
	f.ack(at)
	for _, id := range in.pendingIDs() {
		if c := in.pending[id]; id <= at && c.waits(node) {
			delete(c.waiting, node)
			in.maybeReply(c)
		}
	}
	for _, t := range f.log {
		if !in.send(node, t) {
			break // the feed broke again: the log still has them
		}
	}
}

// Fenced: node took this process for dead, agreed with its peers on
// where its txns end, and takes it in again as a new initiator on the
// feed now opening (docs/DESIGN.md "Feeds that resume"). Any other node
// whose feed is broken may have taken it for dead too, and would answer
// it so on its next dial, dropping what the log kept for it; the nodes
// that took the process in again run what it sends them meanwhile. So
// from now on a broken feed's log no longer counts: a txn is sequenced
// only once every node alive holding a replica of its partition has a
// feed open, and a call that cannot be fails definitely (Unfed). Before,
// the nodes that took the process in ran txns a node cut off, which took
// it for dead too and answered it last, never got: rejoin chaos
// --net-faults on, seed 690063411, three partitions with two digests.
func (in *Initiator) Fenced() { in.fenced = true }

// Abandon answers every call in flight as of unknown outcome, with why,
// and fences the initiator (Fenced): the process learned that the
// cluster took it for dead, so the peers it waits for will not answer
// it, and a caller waiting for them would wait until its own timeout
// instead of trying another node (rejoin chaos --net-faults on: every
// caller of the workload stuck on a node cut off and fenced, 6.8 s
// without a successful op in any partition).
func (in *Initiator) Abandon(why string) {
	in.fenced = true
	for _, id := range in.pendingIDs() {
		c := in.pending[id]
		if c.unsure == "" {
			c.unsure = why
		}
		clear(c.waiting)
		in.maybeReply(c)
	}
}

// FeedAcked: the receiver on node has every txn up to id of this
// process's feed there, which the log need not keep.
func (in *Initiator) FeedAcked(node string, id txnid.ID) {
	if f := in.feeds[node]; f != nil {
		f.ack(id)
	}
}

// DialFailed: the feed to node could not be opened; the next view asks
// again. A dial that asked to resume leaves the feed lost, its log kept.
func (in *Initiator) DialFailed(node string) {
	f := in.feeds[node]
	switch {
	case f == nil || f.state != feedDialing:
	case f.resume:
		f.state, f.resume = feedLost, false
	default:
		delete(in.feeds, node)
	}
}

// FeedLost: the open feed to node broke. Its log keeps every txn the
// node did not acknowledge and takes the ones meant for it from now on;
// the calls go on waiting for its replicas until the feed resumes, the
// node dies, or its replicas stop being live (docs/DESIGN.md "Feeds that
// resume"). Waiting is what keeps a write from being acknowledged
// without a replica the membership still counts.
func (in *Initiator) FeedLost(node string) {
	if f := in.feeds[node]; f != nil && f.state == feedOpen {
		f.state = feedLost
	}
}

// LogBytes is the size of the log of the feed to node, as
// FeedLogBytesMax counts it.
func (in *Initiator) LogBytes(node string) int {
	if f := in.feeds[node]; f != nil {
		return f.logBytes
	}
	return 0
}

// Missed returns the partitions the next hello to node names: those this
// initiator sequenced a txn of while it had no feed there.
func (in *Initiator) Missed(node string) []uint32 {
	var ps []uint32
	for p := range in.missed[node] {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}
