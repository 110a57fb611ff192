package wire

import (
	"strconv"

	"github.com/rejoin-db/rejoin/txnid"
)

// Propose is the destination's proposal of the txn ID P from which it
// holds every txn (DESIGN.md step 3): the maximum over the partition's
// initiators of the first ID it heard from each since joining the feed
// (recovery.Coverage says why not simply the first buffered txn).
type Propose struct {
	MsgHeader
	TxnID txnid.ID
}

// Type implements Message.
func (*Propose) Type() MsgType { return MsgPropose }

// Answer is the source's answer S >= P: the txn at which its snapshot
// starts. The destination holds every txn >= S (DESIGN.md step 3).
type Answer struct {
	MsgHeader
	TxnID txnid.ID
	// Rows is the source's row count when it answered: a hint the
	// destination sizes its tables by before the snapshot comes
	// (docs/DESIGN.md, "Sizing the destination"). It is not checked
	// against anything; the handoff's Rows and digest are what count.
	Rows uint64
}

// Type implements Message.
func (*Answer) Type() MsgType { return MsgAnswer }

// Ack acknowledges every Block of the rejoin with Block.Seq <= Seq. It is
// cumulative, so a lost Ack is repaired by the next one and the source's
// flow-control window needs no per-block state.
type Ack struct {
	MsgHeader
	Seq uint64
}

// Type implements Message.
func (*Ack) Type() MsgType { return MsgAck }

// Handoff ends the stream at txn boundary E (DESIGN.md step 7): the source
// has executed every txn < E and none >= E, and has sent every block that
// brings the destination to that state.
type Handoff struct {
	MsgHeader
	// TxnID is E, the first txn the destination executes itself.
	TxnID txnid.ID
	// Digest is the source's partition digest after every txn < E. The
	// destination compares it with its own before going live.
	Digest uint64
	// LastSeq is the Seq of the last Block sent before this Handoff, so
	// the destination can tell it applied every block, the last ones
	// included, which Acks alone would not show it.
	LastSeq uint64
	// Rows is the number of live rows in the partition at E: a second,
	// readable check beside the digest and a figure for the report.
	Rows uint64
	// Initiators are the initiators whose txns the source may still run
	// at or after E (those its executor tracks or has a txn queued from),
	// in increasing order, at most txnid.InitiatorsMax. The destination
	// goes live only if it holds every txn >= E of each (docs/DESIGN.md
	// "Feeds that open late").
	Initiators []txnid.Initiator
}

// Type implements Message.
func (*Handoff) Type() MsgType { return MsgHandoff }

// HandoffAck is the destination's answer to Handoff (DESIGN.md step 7): it
// went live at E with this digest, which the source compares with the one
// it handed off. Only then is the rejoin done; a source that hears no
// HandoffAck takes the attempt as failed, so a lost handoff or a
// mismatch can never end as a silent success.
type HandoffAck struct {
	MsgHeader
	// TxnID is E, as the Handoff carried it.
	TxnID txnid.ID
	// Digest is the destination's partition digest at E, when it went
	// live: equal to Handoff.Digest, or it would not have.
	Digest uint64
}

// Type implements Message.
func (*HandoffAck) Type() MsgType { return MsgHandoffAck }

// AbortTextBytesMax bounds Abort.Text. AppendMessage cuts a longer text;
// DecodeMessage refuses one with ErrTooLarge.
const AbortTextBytesMax = 512

// AbortReason says why a rejoin was aborted. The numbers are part of the
// wire format; never renumber. A decoder accepts values it does not know,
// so that an abort from a newer peer still reads as an abort.
type AbortReason uint8

const (
	AbortUnknown        AbortReason = 0  // no reason given
	AbortTimeout        AbortReason = 1  // no progress within the stall window
	AbortDigestMismatch AbortReason = 2  // destination digest != Handoff.Digest
	AbortStaleEpoch     AbortReason = 3  // message from a superseded attempt
	AbortDecodeError    AbortReason = 4  // a frame or block failed to decode or apply
	AbortPeerAbort      AbortReason = 5  // passing on the other side's abort
	AbortNodeFailed     AbortReason = 6  // a node of the partition failed (hara kiri)
	AbortShutdown       AbortReason = 7  // this node is shutting down
	AbortClaimLost      AbortReason = 8  // the executor lost or could not refresh its claim
	AbortProtocol       AbortReason = 9  // a message out of order for the current state
	AbortOverload       AbortReason = 10 // change log over its bound despite throttling
	AbortInternal       AbortReason = 11 // a bug or an unexpected local error
	AbortConnLost       AbortReason = 12 // the connection to the peer broke
	AbortUncovered      AbortReason = 13 // the destination lacks an initiator's txns >= E
)

var abortReasonNames = [...]string{
	AbortUnknown:        "unknown",
	AbortTimeout:        "timeout",
	AbortDigestMismatch: "digest-mismatch",
	AbortStaleEpoch:     "stale-epoch",
	AbortDecodeError:    "decode-error",
	AbortPeerAbort:      "peer-abort",
	AbortNodeFailed:     "node-failed",
	AbortShutdown:       "shutdown",
	AbortClaimLost:      "claim-lost",
	AbortProtocol:       "protocol",
	AbortOverload:       "overload",
	AbortInternal:       "internal",
	AbortConnLost:       "conn-lost",
	AbortUncovered:      "uncovered",
}

func (r AbortReason) String() string {
	if int(r) < len(abortReasonNames) {
		return abortReasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// Valid reports whether r is one of the reasons above.
func (r AbortReason) Valid() bool { return int(r) < len(abortReasonNames) }

// Abort ends a rejoin, from either side (DESIGN.md step 8). The receiver
// drops the stream's state; a new attempt starts from the claim.
type Abort struct {
	MsgHeader
	Reason AbortReason
	// Text is for people: the error as the aborting side saw it.
	Text string
}

// Type implements Message.
func (*Abort) Type() MsgType { return MsgAbort }

// Heartbeat keeps the connection's stall detection quiet while nothing
// else flows, e.g. while the source executes up to S before its first
// block.
type Heartbeat struct {
	MsgHeader
	// Tick is the sender's tick count, so a receiver can see heartbeats
	// that arrive out of order or repeated; wire gives it no meaning.
	Tick uint64
}

// Type implements Message.
func (*Heartbeat) Type() MsgType { return MsgHeartbeat }

// Hold is the destination's back-pressure on the source (docs/DESIGN.md
// "Bounds"). The destination buffers every txn of the partition until the
// handoff, so its buffer grows with the partition's write rate for as long
// as the rejoin lasts. Hold says the buffer passed its hold mark: the
// source holds execution of the partition while it streams, until the
// handoff. That slows the partition's writes (their replies wait for the
// source) and so its clients, not the feed, which also carries every
// other partition's txns. The destination sends it once, and again after
// a resume.
type Hold struct {
	MsgHeader
}

// Type implements Message.
func (*Hold) Type() MsgType { return MsgHold }
