package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// Knobs are one run's parameters. Run draws every one of them from the
// seed, always the same number of draws in the same order, so that
// Options.Tweak can pin some of them without moving the others (or the
// workload, the network and the faults, which have streams of their own).
// Times are ticks; the simulated clock reads one millisecond per tick.
type Knobs struct {
	// Tables is 1 (kv, bytes key) or 2 (kv and acct, a two-column key).
	Tables int
	// Sources is how many live replicas the partition has to rejoin from
	// (1 or 2; a run has 2, a script 1 unless it asks), each on a node of
	// its own.
	Sources int
	// Rows is how many rows each table is loaded with before the feed starts.
	Rows int
	// Initiators is how many initiators send txns and heartbeats (1-4).
	Initiators int
	// SkewMillisMax bounds each initiator's clock offset from the simulated
	// clock, in either direction; offsets also step now and then.
	SkewMillisMax int
	// TxnPct is the chance, per tick and initiator, of sending a txn.
	TxnPct int
	// HeartbeatTicks: an initiator that sent nothing for this long
	// heartbeats.
	HeartbeatTicks int
	// FeedDelayMax, ConnDelayMax and GhostDelayMax bound the delays of the
	// initiators' links, of a rejoin connection (at least 1), and of the
	// route that brings a cut attempt's late messages to a newer attempt.
	FeedDelayMax, ConnDelayMax, GhostDelayMax int
	// SplitPct is the chance that a frame reaches the receiver in two
	// pieces, so the decoder meets truncated input.
	SplitPct int
	// StepsMax bounds the txns the source executor runs per tick.
	StepsMax int
	// Codec compresses the frames of every rejoin connection.
	Codec wire.Codec
	// The source processor's and its stream's limits (see
	// recovery.SourceConfig and cow.Config).
	BlockBytesMax        int
	WindowBlocksMax      int
	ChangeLogBytesMax    int
	ChangeLogTxnBytesMax int
	PaceLowWaterBytes    int
	PaceTxnsPerTick      int
	ThrottleWindowTicks  int
	HandoffLogBytesMax   int
	RoundsMax            int
	// StallTicksMax and ProcHeartbeatTicks are both processors' stall
	// window and heartbeat interval.
	StallTicksMax, ProcHeartbeatTicks int
	// ResumeGraceTicks: how long a source whose connection broke redials
	// the destination to resume the attempt before it aborts it
	// (supervise.HoldingConfig.ResumeGrace); below or above the stall
	// window. BrokenHoldTicks: how long of that it may hold its partition
	// for the destination (recovery.Source.HoldsPartition) before it
	// aborts (HoldingConfig.BrokenHoldMax).
	ResumeGraceTicks, BrokenHoldTicks int
	// BeatAsks: an initiator that sequences a txn asks every other one for
	// a heartbeat above it, as recovery/node's initiator does (BeatAsk on
	// its feeds); the asked one answers through Initiator.BeatPast.
	BeatAsks bool
	// BeatLeadTicks and BeatLeadQuietTicks: an initiator that sequenced
	// nothing for BeatLeadQuietTicks sends heartbeats BeatLeadTicks
	// ahead of its clock (a tick is its clock's millisecond), as
	// recovery/node's does (Config.BeatLead); 0: at the clock.
	BeatLeadTicks, BeatLeadQuietTicks int
	// PumpBlocksMax: a source pump cuts at most this many blocks, as
	// recovery/node's does one (recovery.SourceConfig.PumpBlocksMax); 0:
	// the window's worth.
	PumpBlocksMax int
	// FeedLogBytesMax bounds each initiator's feed logs
	// (recovery.InitiatorConfig.FeedLogBytesMax; 0: the default, which a
	// run never fills). Some runs get one of a few txns, so that a log
	// fills: a broken feed's misses the node or refuses the call, an open
	// one's refuses it until the node acknowledges.
	FeedLogBytesMax int
	// FeedAckPct is the chance that a source node acknowledges a feed
	// item it read with more due behind it (wire.FeedAck, everything up
	// to it; the last one due is always acknowledged), FeedAckDelayMax
	// bounds the ticks the ack takes back: rare or slow acks leave a log
	// long when its feed breaks.
	FeedAckPct, FeedAckDelayMax int
	// FeedBreaks is how many feeds to source nodes break outside a lost
	// registration (feedbreak.go). FeedGapTicksMax bounds how long a
	// broken feed's node stays out of reach, FeedDialTicksMax how long a
	// redial takes to be answered; the core logs txns meanwhile.
	FeedBreaks, FeedGapTicksMax, FeedDialTicksMax int
	// Faults is how many faults are planned; each can end one attempt, so
	// a run takes at most Faults+1 attempts.
	Faults int
	// StartTick is when the supervisor starts the first attempt.
	StartTick int
	// WorkloadTicks and LiveTicks: txns flow until both WorkloadTicks have
	// passed and the destination has been live for LiveTicks.
	WorkloadTicks, LiveTicks int
	// TicksMax: a run not finished by then fails.
	TicksMax int
	// ClaimTTLTicks is the claim's lease (0: no claims, a script's
	// default); its holder's guard (claim.Guard) keeps it alive every
	// KeepaliveTicks and checks it claim.ChecksPerWindow times every
	// ClaimWindowTicks, both at most half the TTL (as recovery/claim's
	// window is).
	ClaimTTLTicks, KeepaliveTicks, ClaimWindowTicks int
	// ElectionTicksMax bounds how long a new supervisor takes to be
	// elected after the leader dies.
	ElectionTicksMax int
	// StaleTicks is the health task's StaleAfter: a running task not
	// touched for this long is reset. As the node sets it: the stall
	// window plus two claim windows, so a rejoin that moves on is never
	// reset under its holder.
	StaleTicks int
	// ClaimWithinTicks is Decide's ClaimWithin: an assigned source that
	// has not claimed the task by then loses the assignment.
	ClaimWithinTicks int
	// LeaseGuard: a holder also stops, before it does anything else and
	// before its source sends anything, once its guard no longer holds
	// the claim certainly (claim.Guard.Held, the node's rule), without
	// waiting for its next check. Without it (the claims issue's model as
	// written) a holder woken from a pause acts until its guard's first
	// look, and may write after its claim was lost (invariant e then only
	// orders the writes).
	LeaseGuard bool
	// Joins: the initiators join the partition on each feed (wire.Join)
	// and send its txns only once every replica's node answered, so a
	// replica tracks an initiator from its join, not from its feed's
	// opening, as recovery/node runs them (recovery.InitiatorConfig.Joins,
	// docs/DESIGN.md "Sequencers per partition"). On in every seeded run;
	// a script turns it on with setup joins.
	Joins bool
	// Silences is how many initiators' processes go silent during the
	// workload with their feeds open, for 1 to SilenceTicksMax ticks, and
	// are then fenced (silent.go): the replicas repair their tails of the
	// silent one and stop waiting for it. At most one, and only with two
	// initiators or more and no lost registration planned.
	Silences, SilenceTicksMax int
}

// txnLogBytesMax is the most change-log bytes one txn of the workload can
// add: a primary key change logs the old key (a kv key tuple is 19 bytes,
// acct's at most 14) with its 4-byte offset, and dirties the slot (4
// bytes); every other procedure adds less. ChangeLogTxnBytesMax is kept at
// or above it, so no txn goes over the stream's reserve and the log must
// stay within ChangeLogBytesMax (invariant b).
const txnLogBytesMax = 19 + 4 + 4

// drawKnobs draws a run's knobs from r. Every draw happens whatever the
// earlier ones gave, so the sequence is fixed.
func drawKnobs(r *rand.Rand) Knobs {
	var k Knobs
	k.Tables = 1 + r.IntN(2)
	k.Rows = 40 + r.IntN(220)
	k.Initiators = 1 + r.IntN(4)
	k.SkewMillisMax = r.IntN(40)
	// 0.1 to 1.1 txns per tick from all initiators together: enough to
	// keep writes landing behind and ahead of the cursor, not so many that
	// one-row blocks can never catch up.
	k.TxnPct = (10 + r.IntN(100)) / k.Initiators
	k.HeartbeatTicks = 1 + r.IntN(8)
	k.FeedDelayMax = r.IntN(6)
	k.ConnDelayMax = 1 + r.IntN(4)
	k.GhostDelayMax = 10 + r.IntN(80)
	k.SplitPct = r.IntN(30)
	k.StepsMax = 2 + r.IntN(8)
	k.Codec = wire.Codec(r.IntN(3))
	// Small blocks most of the time, so snapshots take many blocks and
	// writes land both behind and ahead of the cursor.
	blocks := [...]int{1, 1, 64, 128, 256, 512, 1024, 4096, 64 << 10}
	k.BlockBytesMax = blocks[r.IntN(len(blocks))]
	k.WindowBlocksMax = 1 + r.IntN(8)
	if k.BlockBytesMax < 128 {
		// Blocks of a row or two: fewer rows, so the run stays within a few
		// thousand ticks (no draw, so the sequence stays fixed).
		k.Rows = 40 + k.Rows%80
	}
	// A quarter of the runs get a change log small enough that the
	// throttle engages; the others one that never fills.
	small := r.IntN(4) == 0
	smallLog := 2*txnLogBytesMax + 8 + r.IntN(400)
	if small {
		k.ChangeLogBytesMax = smallLog
	} else {
		k.ChangeLogBytesMax = 1 << 20
	}
	k.ChangeLogTxnBytesMax = txnLogBytesMax + r.IntN(16)
	hold := k.ChangeLogBytesMax - k.ChangeLogTxnBytesMax
	// Pacing starts above a few hundred bytes at most, so that writes that
	// outpace shipping are slowed even when the log has room.
	k.PaceLowWaterBytes = r.IntN(min(hold, 1024) + 1)
	k.PaceTxnsPerTick = 1 + r.IntN(4)
	k.ThrottleWindowTicks = 1 + r.IntN(10)
	k.HandoffLogBytesMax = [...]int{0, 16, 64, 256}[r.IntN(4)]
	k.RoundsMax = 1 + r.IntN(8)
	k.StallTicksMax = 60 + r.IntN(90)
	k.ProcHeartbeatTicks = 2 + r.IntN(12)
	k.Faults = [...]int{0, 1, 1, 2, 2, 3}[r.IntN(6)]
	k.StartTick = 1 + r.IntN(40)
	k.WorkloadTicks = 200 + r.IntN(400)
	k.LiveTicks = 50 + r.IntN(150)
	k.TicksMax = 30000
	// Drawn last, so the knobs above draw as they did before claims.
	k.ClaimTTLTicks = 20 + r.IntN(160)
	k.KeepaliveTicks = 1 + r.IntN(k.ClaimTTLTicks/2)
	k.ClaimWindowTicks = 2 + r.IntN(k.ClaimTTLTicks/2-1) // a check fits in a window
	k.ElectionTicksMax = 1 + r.IntN(150)
	// Half the runs, with no draw of its own: one more draw would move
	// the workload, network and fault streams of every seed.
	k.LeaseGuard = k.ElectionTicksMax%2 == 0
	// No draws: derived from the knobs above, or fixed.
	k.Sources = 2
	k.StaleTicks = k.StallTicksMax + 2*k.ClaimWindowTicks
	k.ResumeGraceTicks = k.StallTicksMax/4 + (7*k.ElectionTicksMax)%k.StallTicksMax
	k.BrokenHoldTicks = max(1, k.ResumeGraceTicks/5)
	k.BeatAsks = k.StallTicksMax%2 == 0
	k.BeatLeadTicks = [...]int{0, 0, 3, 40}[k.ClaimTTLTicks%4]
	k.BeatLeadQuietTicks = 1 + k.KeepaliveTicks%8
	k.PumpBlocksMax = [...]int{0, 1, 2}[k.StepsMax%3]
	k.ClaimWithinTicks = 50
	// Feeds that resume: derived, no new draw. A txn counts some 100
	// bytes in a log, so a small one holds 1 to 10.
	if k.SplitPct%4 == 0 {
		k.FeedLogBytesMax = 128 + (53*k.GhostDelayMax)%1024
	}
	k.FeedAckPct = [...]int{100, 50, 10, 2}[k.Rows%4]
	k.FeedAckDelayMax = k.GhostDelayMax % 16
	k.FeedBreaks = [...]int{0, 1, 0, 2, 0}[k.ThrottleWindowTicks%5]
	k.FeedGapTicksMax = 1 + (7*k.StallTicksMax)%60
	k.FeedDialTicksMax = k.ProcHeartbeatTicks % 6
	k.Joins = true
	k.Silences = [...]int{0, 1, 0}[k.HeartbeatTicks%3]
	k.SilenceTicksMax = 1 + k.StallTicksMax/2
	return k
}

// validate checks what the simulator itself relies on; the processors
// check their own configs.
func (k Knobs) validate() error {
	switch {
	case k.Tables < 1 || k.Tables > 2:
		return fmt.Errorf("sim: Tables %d, want 1 or 2", k.Tables)
	case k.Sources < 1 || k.Sources > 2:
		return fmt.Errorf("sim: Sources %d, want 1 or 2", k.Sources)
	case k.Initiators < 1 || k.Initiators > 4:
		return fmt.Errorf("sim: Initiators %d, want 1..4", k.Initiators)
	case k.ConnDelayMax < 1:
		return fmt.Errorf("sim: ConnDelayMax %d, want >= 1", k.ConnDelayMax)
	case k.ChangeLogTxnBytesMax < txnLogBytesMax:
		return fmt.Errorf("sim: ChangeLogTxnBytesMax %d below the workload's %d bytes per txn", k.ChangeLogTxnBytesMax, txnLogBytesMax)
	case k.FeedLogBytesMax < 0 || k.FeedBreaks < 0 || k.FeedGapTicksMax < 0 || k.FeedDialTicksMax < 0:
		return fmt.Errorf("sim: feed log %d B, %d breaks, gap %d, dial %d: want >= 0", k.FeedLogBytesMax, k.FeedBreaks, k.FeedGapTicksMax, k.FeedDialTicksMax)
	case k.StepsMax < 1 || k.TicksMax < 1:
		return fmt.Errorf("sim: StepsMax %d, TicksMax %d, want >= 1", k.StepsMax, k.TicksMax)
	case k.ClaimTTLTicks > 0 && (k.KeepaliveTicks < 1 || 2*k.KeepaliveTicks > k.ClaimTTLTicks || k.ClaimWindowTicks < 2 || 2*k.ClaimWindowTicks > k.ClaimTTLTicks):
		return fmt.Errorf("sim: claim TTL %d, keepalive %d, window %d: want keepalive in 1..TTL/2, window in 2..TTL/2", k.ClaimTTLTicks, k.KeepaliveTicks, k.ClaimWindowTicks)
	case k.ClaimTTLTicks > 0 && (k.StaleTicks < 1 || k.ClaimWithinTicks < 1):
		return fmt.Errorf("sim: stale %d, claim within %d: want >= 1", k.StaleTicks, k.ClaimWithinTicks)
	}
	return nil
}

// holdingConfig is the attempt core's timing (supervise.Holding), in
// ticks. A redial is asked a tick after a failed one and answered a few
// ticks later (redialLater); a retry is taken a tick after the requeue
// and up to 29 more (the node's next poll: holdAction).
func (k Knobs) holdingConfig() supervise.HoldingConfig {
	return supervise.HoldingConfig{ResumeGrace: int64(k.ResumeGraceTicks), BrokenHoldMax: int64(k.BrokenHoldTicks), RedialEvery: 1, RetryAfter: 1}
}

func (k Knobs) sourceConfig(h wire.MsgHeader) recovery.SourceConfig {
	return recovery.SourceConfig{
		Header:             h,
		WindowBlocksMax:    k.WindowBlocksMax,
		PumpBlocksMax:      k.PumpBlocksMax,
		StallTicksMax:      k.StallTicksMax,
		HeartbeatTicks:     k.ProcHeartbeatTicks,
		HandoffLogBytesMax: k.HandoffLogBytesMax,
		RoundsMax:          k.RoundsMax,
		Stream: cow.Config{
			BlockBytesMax:        k.BlockBytesMax,
			ChangeLogBytesMax:    k.ChangeLogBytesMax,
			ChangeLogTxnBytesMax: k.ChangeLogTxnBytesMax,
			PaceLowWaterBytes:    k.PaceLowWaterBytes,
			ThrottleWindowTicks:  k.ThrottleWindowTicks,
			PaceTxnsPerTick:      k.PaceTxnsPerTick,
		},
	}
}

func (k Knobs) destinationConfig(h wire.MsgHeader, ins []txnid.Initiator) recovery.DestinationConfig {
	return recovery.DestinationConfig{
		Header:         h,
		Initiators:     ins,
		StallTicksMax:  k.StallTicksMax,
		HeartbeatTicks: k.ProcHeartbeatTicks,
	}
}

// String renders the knobs that shape a run, for the trace's first line.
func (k Knobs) String() string {
	return fmt.Sprintf("tables=%d rows=%d initiators=%d skew=%d txn%%=%d codec=%s block=%dB window=%d pump=%d log=%dB/%dB pace=%dB,%d/tick,%dt handoff=%dB rounds=%d stall=%d hb=%d faults=%d delays=feed%d,conn%d,ghost%d split%%=%d steps=%d claim=ttl%d,keepalive%d,window%d,guard=%v election<=%d feedlog=%dB acks=%d%%,<=%dt breaks=%d,gap<=%d,dial<=%d joins=%v silences=%d,<=%dt",
		k.Tables, k.Rows, k.Initiators, k.SkewMillisMax, k.TxnPct, k.Codec, k.BlockBytesMax, k.WindowBlocksMax, k.PumpBlocksMax,
		k.ChangeLogBytesMax, k.ChangeLogTxnBytesMax, k.PaceLowWaterBytes, k.PaceTxnsPerTick, k.ThrottleWindowTicks,
		k.HandoffLogBytesMax, k.RoundsMax, k.StallTicksMax, k.ProcHeartbeatTicks, k.Faults,
		k.FeedDelayMax, k.ConnDelayMax, k.GhostDelayMax, k.SplitPct, k.StepsMax,
		k.ClaimTTLTicks, k.KeepaliveTicks, k.ClaimWindowTicks, k.LeaseGuard, k.ElectionTicksMax,
		k.FeedLogBytesMax, k.FeedAckPct, k.FeedAckDelayMax, k.FeedBreaks, k.FeedGapTicksMax, k.FeedDialTicksMax, k.Joins, k.Silences, k.SilenceTicksMax)
}
