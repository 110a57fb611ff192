package wire

import (
	"fmt"
	"math"
	"strconv"

	"github.com/rejoin-db/rejoin/txnid"
)

// The cluster messages: what nodes and clients say to each other outside a
// rejoin (recovery/node's doc). A connection opens with a Hello
// naming its kind; then
//   - HelloClient: Calls one way, Replies the other, pipelined, matched
//     by Req;
//   - HelloFeed: Txns and Beats from an initiator to a replica, Dones back;
//   - HelloRejoin: the rejoin messages above, both ways;
//   - HelloRepair: Repairs from a replica to a peer replica, each answered
//     by the Txns it asks for, in ID order, and a RepairEnd;
//   - HelloReach: nothing; the node answers the Hello with its own and
//     closes: a process not registered yet learns that it reaches a peer.
//
// They belong to no rejoin attempt and carry no MsgHeader: their Header
// method returns the zero MsgHeader, and MsgType.Rejoin tells them apart
// from the rejoin messages, which alone go to recovery's processors.
//
// Params and Out are tuples (TupleEncoder.AppendTuple, DecodeValues),
// carried as msgpack bin: wire checks their length, the receiver decodes
// them. A decoded message's Params and Out alias the payload it was
// decoded from, like a Block's Tuples (the frame, or the FrameDecoder's
// buffer for a compressed frame); an empty one decodes as nil.

// Limits of the cluster messages' fields. DecodeMessage refuses a longer
// field with ErrTooLarge; AppendFrame refuses to encode one (ErrTooLarge),
// except error texts, which AppendMessage cuts to ErrTextBytesMax so that an
// error can always be sent.
const (
	// NodeBytesMax bounds a node id (Hello.Node, ReplicaOut.Node).
	NodeBytesMax = 64
	// ProcBytesMax bounds a procedure name (Txn.Proc, Call.Proc).
	ProcBytesMax = 64
	// ProcTupleBytesMax bounds a procedure's Params and Out tuples; it
	// equals partition.TupleBytesMax.
	ProcTupleBytesMax = 4 << 20
	// ErrTextBytesMax bounds the Err text of Done, Reply, ReplicaOut and
	// RepairEnd.
	ErrTextBytesMax = AbortTextBytesMax
	// ReplicaOutsMax bounds Reply.Each: one entry per replica.
	ReplicaOutsMax = 64
)

// ErrText returns the text to put in a message's Err field for err: "" for
// nil, else err's text cut to ErrTextBytesMax without splitting a UTF-8
// sequence, and never "" (which would read as success).
func ErrText(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if s == "" {
		return "error"
	}
	return truncateText(s, ErrTextBytesMax)
}

// HelloKind says what a connection is for. The numbers are part of the wire
// format; never renumber.
type HelloKind uint8

const (
	HelloClient HelloKind = 1 // client -> node: Calls and Replies
	HelloFeed   HelloKind = 2 // initiator node -> replica node: Txns, Beats; Dones back
	HelloRejoin HelloKind = 3 // source node -> destination node: one rejoin attempt
	HelloRepair HelloKind = 4 // replica node -> replica node: repair a dead initiator's unacknowledged tail of one partition
	HelloReach  HelloKind = 5 // node -> node: answered with a Hello and closed; a starting process checks it reaches its peers
)

func (k HelloKind) String() string {
	switch k {
	case HelloClient:
		return "client"
	case HelloFeed:
		return "feed"
	case HelloRejoin:
		return "rejoin"
	case HelloRepair:
		return "repair"
	case HelloReach:
		return "reach"
	}
	return "hello(" + strconv.Itoa(int(k)) + ")"
}

// Valid reports whether k is one of the kinds above.
func (k HelloKind) Valid() bool { return k >= HelloClient && k <= HelloReach }

// Hello is the first frame of every cluster connection, from the dialer;
// the node answers with a Hello of the same Kind and its own Node id, or
// with a Reply whose Err says why not, and closes.
type Hello struct {
	Kind HelloKind
	// Node is the sender's node id ("n<N>"), at most NodeBytesMax bytes.
	Node string
	// Initiator is the sender's initiator id (HelloFeed).
	Initiator uint16
	// Partition and Epoch name the rejoin attempt (HelloRejoin). On a
	// HelloFeed, Epoch is the initiator's incarnation: it grows with every
	// start of the sender's process, so a receiver tells a new process's
	// feed from a redial of the same one.
	Partition uint32
	Epoch     uint64
	// Missed, on a HelloFeed, are the partitions whose txns the sending
	// process sequenced, since it started, while it had no feed to this
	// node, in increasing order: the replicas here of those partitions
	// lack them (docs/DESIGN.md "Without the coordinator"). At most
	// MissedMax.
	Missed []uint32
	// Resume, on a HelloFeed, asks the receiver to go on with the
	// sending process's previous feed there, which broke: the sender
	// holds every txn it sent or meant for this node with an ID above
	// Kept and sends again what the receiver did not get (docs/DESIGN.md
	// "Feeds that resume"). The receiver answers with a FeedAck naming
	// where it stopped, or with a floor (a Beat) if it cannot resume.
	Resume bool
	Kept   txnid.ID
	// To, on a HelloFeed, is the receiver's process the sender means
	// (its incarnation, as the sender's view of the membership names
	// it). A process of another incarnation refuses the feed: a sender
	// whose view lags a restart would otherwise open it to the new
	// process under the old one's name, take the feed for stale once its
	// view caught up, and dial again afresh, which the receiver must
	// read as the same process re-opening a feed it sent txns on
	// (docs/DESIGN.md "Feeds that resume").
	To uint64
}

// MissedMax bounds Hello.Missed: the most partitions a cluster has.
const MissedMax = 1 << 16

// HelloFrameBytesMax bounds the frame a node reads where a Hello is due,
// before it knows who sent it (stream.Conn.SetFrameBytesMax): the largest
// Hello, MissedMax partitions of five bytes each and the rest, is some
// 320 KiB.
const HelloFrameBytesMax = 384 << 10

// Txn is one transaction on a feed: execute Proc(Params) on Partition at ID.
type Txn struct {
	Partition uint32
	ID        txnid.ID
	Proc      string
	Params    []byte
}

// Beat tells a feed's receiver that nothing below ID will follow on this
// feed. The receiver's first message back on a feed is a Beat too, its
// floor: its replicas executed nothing above ID, and the initiator's IDs
// on the feed must lie above it.
type Beat struct {
	ID txnid.ID
}

// FeedAck tells a feed's sender that every txn and heartbeat of its
// process on this feed up to ID reached the receiver, so it need not keep
// them to send again; the receiver sends one now and then. As the first
// answer to a Hello that asks to Resume, it says where the receiver
// stopped: the sender sends again everything it holds above ID.
type FeedAck struct {
	ID txnid.ID
}

// Fenced answers a Hello that asks to Resume when the receiver cannot:
// its replicas stopped waiting for the sending process, taken for dead,
// after they agreed with their peers on where its txns end
// (docs/DESIGN.md "Feeds that resume"). What the process sent past that
// point runs nowhere here, so its own replicas of Partitions, which the
// receiver holds live, must not stand: they ran or may run txns that the
// live replicas here never will. The floor (a Beat) follows: the process
// joins again as a new initiator would. At most MissedMax partitions, in
// increasing order.
type Fenced struct {
	Partitions []uint32
}

// BeatAsk asks the node at the other end of a feed for a heartbeat: its
// own initiator, which another initiator's txns do not reach, should send
// a Beat above ID on each of its feeds. The feed's sender sequenced txns
// up to ID, and the replicas that got them run them only once every
// initiator they track has passed them; an idle initiator would pass them
// only at its next periodic heartbeat (docs/DESIGN.md "Heartbeats on
// demand"). It orders nothing on the feed it travels on.
type BeatAsk struct {
	ID txnid.ID
}

// Join asks the node at the other end of a feed to have its replica of
// Partition track the feed's initiator: its safe point waits for that
// initiator from the answer on. An initiator sends a partition's txns
// only on feeds where it joined the partition, and joins only the
// partitions its own node holds a replica of, so a node's silence stalls
// only the partitions it holds (docs/DESIGN.md "Sequencers per
// partition"). It travels in the feed's order: the txns of Partition
// that follow it find the initiator tracked.
type Join struct {
	Partition uint32
}

// Joined answers a Join on the feed: the replica of Partition here tracks
// the initiator, and Floor is the highest txn ID it executed or read as
// safe, or took from an earlier process of the initiator; the initiator's
// IDs go above it (docs/DESIGN.md "An initiator that joins"). Zero if the
// node hosts no replica of Partition yet: one created later tracks the
// initiator from its start.
type Joined struct {
	Partition uint32
	Floor     txnid.ID
}

// Done is a replica's result of one executed Txn: Out, or Err if it failed.
type Done struct {
	Partition uint32
	ID        txnid.ID
	Out       []byte
	Err       string
}

// Call asks a node to run Proc(Params) on Partition as one transaction. Req
// is the client's number for matching the Reply. Each asks for every
// replica's result in Reply.Each.
type Call struct {
	Req       uint64
	Partition uint32
	Proc      string
	Params    []byte
	Each      bool
}

// Reply answers the Call numbered Req: the txn's ID and result, or Err; with
// Call.Each, every replica's result.
//
// Req 0 with RefusedStopping is a stopping node's last word on a client
// connection (a goaway, as HTTP/2 has): it read no call after the last it
// answered, so a call sent on the connection and not answered before it
// ran nowhere, and the client may send it to another node. Calls are
// numbered from 1: no call is answered so.
type Reply struct {
	Req  uint64
	ID   txnid.ID
	Out  []byte
	Err  string
	Each []ReplicaOut
	// Uncertain: the txn was sequenced and sent, but no replica's result
	// came back, so it may or may not have committed. Err says why. A
	// client must not take such a reply for a failure.
	Uncertain bool
	// Refused, if not RefusedNone, says the node refused the call with
	// nothing sequenced, and why, so that a client tells a refusal from a
	// procedure's error without reading Err's text.
	Refused Refusal
}

// Refusal is why a node refused a call with nothing sequenced (Reply.Refused).
type Refusal uint8

// The refusals. A client may send a call refused so to another node: it
// ran nowhere.
const (
	RefusedNone Refusal = iota
	// RefusedNotRegistered: the node does not hold its registration in
	// etcd (etcd unreachable, or its lease lapsed); another node may take
	// the call.
	RefusedNotRegistered
	// RefusedNotBootstrapped: a node of the cluster's placement has never
	// started, so nothing may be written yet; it passes once it has.
	RefusedNotBootstrapped
	// RefusedNotReady: the node could not send the txn to every replica
	// of its partition in time (a feed not open yet, its membership view
	// behind its registration).
	RefusedNotReady
	// RefusedStopping: the node is stopping and takes no new call.
	RefusedStopping
	// RefusedNotHolder: the node holds no replica of the call's partition
	// and sequences none of its txns; a node that holds one takes it.
	RefusedNotHolder
	// RefusedMax is the highest refusal this version knows; a higher one
	// decodes as is, for a client to take as a refusal it cannot name.
	RefusedMax = RefusedNotHolder
)

func (r Refusal) String() string {
	switch r {
	case RefusedNone:
		return "none"
	case RefusedNotRegistered:
		return "not registered"
	case RefusedNotBootstrapped:
		return "not bootstrapped"
	case RefusedNotReady:
		return "not ready"
	case RefusedStopping:
		return "stopping"
	case RefusedNotHolder:
		return "not a holder"
	}
	return fmt.Sprintf("refusal %d", uint8(r))
}

// ReplicaOut is one replica's result in Reply.Each.
type ReplicaOut struct {
	Node string
	Out  []byte
	Err  string
}

// Repair asks a peer replica for every txn of Initiator on Partition with
// an ID above After that the initiator's incarnation Incarnation sent: the
// unacknowledged tail of a dead incarnation's feed. The peer answers once
// its own feed from that incarnation has ended, with those Txns, in ID
// order, then a RepairEnd; txns of a later incarnation are not part of it.
type Repair struct {
	Partition   uint32
	Initiator   uint16
	After       txnid.ID
	Incarnation uint64
}

// RepairEnd ends the answer to the Repair of Partition and Initiator. Last
// is the highest ID of Initiator the answering peer holds, a txn's or a
// heartbeat's. Err, if not empty, says why the peer cannot answer (its own
// feed from Initiator is still open, or the asked range is older than what
// it keeps); no Txns precede it then.
type RepairEnd struct {
	Partition uint32
	Initiator uint16
	Last      txnid.ID
	Err       string
}

// Type implements Message.
func (*Hello) Type() MsgType { return MsgHello }

// Type implements Message.
func (*Txn) Type() MsgType { return MsgTxn }

// Type implements Message.
func (*Beat) Type() MsgType { return MsgBeat }

// Type implements Message.
func (*BeatAsk) Type() MsgType { return MsgBeatAsk }

// Type implements Message.
func (*FeedAck) Type() MsgType { return MsgFeedAck }

// Type implements Message.
func (*Fenced) Type() MsgType { return MsgFenced }

// Type implements Message.
func (*Join) Type() MsgType { return MsgJoin }

// Type implements Message.
func (*Joined) Type() MsgType { return MsgJoined }

// Type implements Message.
func (*Done) Type() MsgType { return MsgDone }

// Type implements Message.
func (*Call) Type() MsgType { return MsgCall }

// Type implements Message.
func (*Reply) Type() MsgType { return MsgReply }

// Type implements Message.
func (*Repair) Type() MsgType { return MsgRepair }

// Type implements Message.
func (*RepairEnd) Type() MsgType { return MsgRepairEnd }

// Header implements Message: the zero MsgHeader, as a Hello is not a
// message of a rejoin attempt (its Partition and Epoch only name one).
func (*Hello) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*Txn) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*Beat) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*BeatAsk) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*FeedAck) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*Fenced) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*Join) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*Joined) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*Done) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*Call) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*Reply) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*Repair) Header() MsgHeader { return MsgHeader{} }

// Header implements Message: the zero MsgHeader.
func (*RepairEnd) Header() MsgHeader { return MsgHeader{} }

// Field counts of the cluster messages' msgpack arrays. Part of the format.
const (
	helloFields      = 9 // [kind, node, initiator, partition, epoch, [missed, ...], resume, kept, to]
	txnFields        = 4 // [partition, id, proc, params]
	beatFields       = 1 // [id]
	beatAskFields    = 1 // [id]
	feedAckFields    = 1 // [id]
	fencedFields     = 1 // [[partition, ...]]
	joinFields       = 1 // [partition]
	joinedFields     = 2 // [partition, floor]
	doneFields       = 4 // [partition, id, out, err]
	callFields       = 5 // [req, partition, proc, params, each]
	replyFields      = 7 // [req, id, out, err, [replicaOut, ...], uncertain, refused]
	replicaOutFields = 3 // [node, out, err]
	repairFields     = 4 // [partition, initiator, after, incarnation]
	repairEndFields  = 4 // [partition, initiator, last, err]
)

// appendCluster appends the encoding of a cluster message, or reports that
// m is not one.
func appendCluster(dst []byte, m Message) ([]byte, bool) {
	switch m := m.(type) {
	case *Hello:
		if !m.Kind.Valid() {
			panic(fmt.Sprintf("wire: Hello of %v", m.Kind))
		}
		dst = AppendArrayHeader(dst, helloFields)
		dst = appendUint(dst, uint64(m.Kind))
		dst = appendStr(dst, m.Node)
		dst = appendUint(dst, uint64(m.Initiator))
		dst = appendUint(dst, uint64(m.Partition))
		dst = appendUint(dst, m.Epoch)
		dst = AppendArrayHeader(dst, len(m.Missed))
		for _, p := range m.Missed {
			dst = appendUint(dst, uint64(p))
		}
		dst = appendBool(dst, m.Resume)
		dst = appendUint(dst, uint64(m.Kept))
		return appendUint(dst, m.To), true
	case *Txn:
		dst = AppendArrayHeader(dst, txnFields)
		dst = appendUint(dst, uint64(m.Partition))
		dst = appendUint(dst, uint64(m.ID))
		dst = appendStr(dst, m.Proc)
		return appendBin(dst, m.Params), true
	case *Beat:
		dst = AppendArrayHeader(dst, beatFields)
		return appendUint(dst, uint64(m.ID)), true
	case *BeatAsk:
		dst = AppendArrayHeader(dst, beatAskFields)
		return appendUint(dst, uint64(m.ID)), true
	case *FeedAck:
		dst = AppendArrayHeader(dst, feedAckFields)
		return appendUint(dst, uint64(m.ID)), true
	case *Fenced:
		dst = AppendArrayHeader(dst, fencedFields)
		dst = AppendArrayHeader(dst, len(m.Partitions))
		for _, p := range m.Partitions {
			dst = appendUint(dst, uint64(p))
		}
		return dst, true
	case *Join:
		dst = AppendArrayHeader(dst, joinFields)
		return appendUint(dst, uint64(m.Partition)), true
	case *Joined:
		dst = AppendArrayHeader(dst, joinedFields)
		dst = appendUint(dst, uint64(m.Partition))
		return appendUint(dst, uint64(m.Floor)), true
	case *Done:
		dst = AppendArrayHeader(dst, doneFields)
		dst = appendUint(dst, uint64(m.Partition))
		dst = appendUint(dst, uint64(m.ID))
		dst = appendBin(dst, m.Out)
		return appendStr(dst, truncateText(m.Err, ErrTextBytesMax)), true
	case *Call:
		dst = AppendArrayHeader(dst, callFields)
		dst = appendUint(dst, m.Req)
		dst = appendUint(dst, uint64(m.Partition))
		dst = appendStr(dst, m.Proc)
		dst = appendBin(dst, m.Params)
		return appendBool(dst, m.Each), true
	case *Reply:
		dst = AppendArrayHeader(dst, replyFields)
		dst = appendUint(dst, m.Req)
		dst = appendUint(dst, uint64(m.ID))
		dst = appendBin(dst, m.Out)
		dst = appendStr(dst, truncateText(m.Err, ErrTextBytesMax))
		dst = AppendArrayHeader(dst, len(m.Each))
		for i := range m.Each {
			o := &m.Each[i]
			dst = AppendArrayHeader(dst, replicaOutFields)
			dst = appendStr(dst, o.Node)
			dst = appendBin(dst, o.Out)
			dst = appendStr(dst, truncateText(o.Err, ErrTextBytesMax))
		}
		dst = appendBool(dst, m.Uncertain)
		return appendUint(dst, uint64(m.Refused)), true
	case *Repair:
		dst = AppendArrayHeader(dst, repairFields)
		dst = appendUint(dst, uint64(m.Partition))
		dst = appendUint(dst, uint64(m.Initiator))
		dst = appendUint(dst, uint64(m.After))
		return appendUint(dst, m.Incarnation), true
	case *RepairEnd:
		dst = AppendArrayHeader(dst, repairEndFields)
		dst = appendUint(dst, uint64(m.Partition))
		dst = appendUint(dst, uint64(m.Initiator))
		dst = appendUint(dst, uint64(m.Last))
		return appendStr(dst, truncateText(m.Err, ErrTextBytesMax)), true
	}
	return dst, false
}

// checkClusterLimits returns an ErrTooLarge error if a field of m is over
// its limit (ErrMalformed for a Handoff's initiators out of order), so
// that AppendFrame never sends what DecodeMessage refuses. Error texts are
// not checked: AppendMessage cuts them.
func checkClusterLimits(m Message) error {
	var err error
	check := func(field string, n, limit int) {
		if err == nil && n > limit {
			err = fmt.Errorf("%w: %v %s of %d bytes, limit %d", ErrTooLarge, m.Type(), field, n, limit)
		}
	}
	switch m := m.(type) {
	case *Handoff:
		if len(m.Initiators) > txnid.InitiatorsMax {
			return fmt.Errorf("%w: Handoff of %d initiators, limit %d", ErrTooLarge, len(m.Initiators), txnid.InitiatorsMax)
		}
		for i, in := range m.Initiators {
			if in >= txnid.InitiatorsMax || i > 0 && in <= m.Initiators[i-1] {
				return fmt.Errorf("%w: Handoff initiators %v, want increasing, each below %d", ErrMalformed, m.Initiators, txnid.InitiatorsMax)
			}
		}
	case *Hello:
		check("node", len(m.Node), NodeBytesMax)
		if len(m.Missed) > MissedMax {
			return fmt.Errorf("%w: Hello missing %d partitions, limit %d", ErrTooLarge, len(m.Missed), MissedMax)
		}
		for i, p := range m.Missed {
			if i > 0 && p <= m.Missed[i-1] {
				return fmt.Errorf("%w: Hello missed partitions %v, want increasing", ErrMalformed, m.Missed)
			}
		}
	case *Fenced:
		if len(m.Partitions) > MissedMax {
			return fmt.Errorf("%w: Fenced of %d partitions, limit %d", ErrTooLarge, len(m.Partitions), MissedMax)
		}
		for i, p := range m.Partitions {
			if i > 0 && p <= m.Partitions[i-1] {
				return fmt.Errorf("%w: Fenced partitions %v, want increasing", ErrMalformed, m.Partitions)
			}
		}
	case *Txn:
		check("proc", len(m.Proc), ProcBytesMax)
		check("params", len(m.Params), ProcTupleBytesMax)
	case *Done:
		check("out", len(m.Out), ProcTupleBytesMax)
	case *Call:
		check("proc", len(m.Proc), ProcBytesMax)
		check("params", len(m.Params), ProcTupleBytesMax)
	case *Reply:
		check("out", len(m.Out), ProcTupleBytesMax)
		if err == nil && len(m.Each) > ReplicaOutsMax {
			err = fmt.Errorf("%w: Reply of %d replica results, limit %d", ErrTooLarge, len(m.Each), ReplicaOutsMax)
		}
		for i := range m.Each {
			check("replica node", len(m.Each[i].Node), NodeBytesMax)
			check("replica out", len(m.Each[i].Out), ProcTupleBytesMax)
		}
	}
	return err
}

func appendStr(dst []byte, s string) []byte {
	return append(appendStrHeader(dst, len(s)), s...)
}

func appendBin(dst []byte, b []byte) []byte {
	return append(appendBinHeader(dst, len(b)), b...)
}

func appendBool(dst []byte, v bool) []byte {
	if v {
		return append(dst, 0xc3)
	}
	return append(dst, 0xc2)
}

// decodeCluster decodes the cluster message of type t from r, or returns
// nil if t is not a cluster message type.
func decodeCluster(t MsgType, r *msgReader) Message {
	switch t {
	case MsgHello:
		var h Hello
		r.fields(helloFields)
		h.Kind = HelloKind(r.uint(math.MaxUint8))
		if r.err == nil && !h.Kind.Valid() {
			r.fail(fmt.Errorf("%w: hello kind %d", ErrMalformed, h.Kind))
		}
		h.Node = r.str(NodeBytesMax)
		h.Initiator = uint16(r.uint(math.MaxUint16))
		h.Partition = uint32(r.uint(math.MaxUint32))
		h.Epoch = r.uint(math.MaxUint64)
		h.Missed = r.partitions(MissedMax)
		h.Resume = r.bool()
		h.Kept = r.txnID()
		h.To = r.uint(math.MaxUint64)
		return &h
	case MsgTxn:
		var x Txn
		r.fields(txnFields)
		x.Partition = uint32(r.uint(math.MaxUint32))
		x.ID = r.txnID()
		x.Proc = r.str(ProcBytesMax)
		x.Params = r.bin(ProcTupleBytesMax)
		return &x
	case MsgBeat:
		var b Beat
		r.fields(beatFields)
		b.ID = r.txnID()
		return &b
	case MsgBeatAsk:
		var b BeatAsk
		r.fields(beatAskFields)
		b.ID = r.txnID()
		return &b
	case MsgFeedAck:
		var a FeedAck
		r.fields(feedAckFields)
		a.ID = r.txnID()
		return &a
	case MsgFenced:
		var f Fenced
		r.fields(fencedFields)
		f.Partitions = r.partitions(MissedMax)
		return &f
	case MsgJoin:
		var j Join
		r.fields(joinFields)
		j.Partition = uint32(r.uint(math.MaxUint32))
		return &j
	case MsgJoined:
		var j Joined
		r.fields(joinedFields)
		j.Partition = uint32(r.uint(math.MaxUint32))
		j.Floor = r.txnID()
		return &j
	case MsgDone:
		var d Done
		r.fields(doneFields)
		d.Partition = uint32(r.uint(math.MaxUint32))
		d.ID = r.txnID()
		d.Out = r.bin(ProcTupleBytesMax)
		d.Err = r.str(ErrTextBytesMax)
		return &d
	case MsgCall:
		var c Call
		r.fields(callFields)
		c.Req = r.uint(math.MaxUint64)
		c.Partition = uint32(r.uint(math.MaxUint32))
		c.Proc = r.str(ProcBytesMax)
		c.Params = r.bin(ProcTupleBytesMax)
		c.Each = r.bool()
		return &c
	case MsgReply:
		var p Reply
		r.fields(replyFields)
		p.Req = r.uint(math.MaxUint64)
		p.ID = r.txnID()
		p.Out = r.bin(ProcTupleBytesMax)
		p.Err = r.str(ErrTextBytesMax)
		if n := r.array(ReplicaOutsMax); n > 0 {
			p.Each = make([]ReplicaOut, n)
			for i := range p.Each {
				o := &p.Each[i]
				r.fields(replicaOutFields)
				o.Node = r.str(NodeBytesMax)
				o.Out = r.bin(ProcTupleBytesMax)
				o.Err = r.str(ErrTextBytesMax)
			}
		}
		p.Uncertain = r.bool()
		p.Refused = Refusal(r.uint(math.MaxUint8))
		return &p
	case MsgRepair:
		var x Repair
		r.fields(repairFields)
		x.Partition = uint32(r.uint(math.MaxUint32))
		x.Initiator = uint16(r.uint(math.MaxUint16))
		x.After = r.txnID()
		x.Incarnation = r.uint(math.MaxUint64)
		return &x
	case MsgRepairEnd:
		var e RepairEnd
		r.fields(repairEndFields)
		e.Partition = uint32(r.uint(math.MaxUint32))
		e.Initiator = uint16(r.uint(math.MaxUint16))
		e.Last = r.txnID()
		e.Err = r.str(ErrTextBytesMax)
		return &e
	}
	return nil
}

// fields reads an array header that must announce exactly n elements.
func (r *msgReader) fields(n int) {
	if r.err != nil {
		return
	}
	got, size, err := ReadArrayHeader(r.b[r.pos:])
	if err != nil {
		r.fail(err)
		return
	}
	if got != n {
		r.fail(fmt.Errorf("%w: %d fields, want %d", ErrMalformed, got, n))
		return
	}
	r.pos += size
}

// array reads an array header of at most limit elements and returns the
// count. Every element takes at least one byte, so a count over what is
// left of the input is ErrTruncated, refused before anything is allocated.
func (r *msgReader) array(limit int) int {
	if r.err != nil {
		return 0
	}
	n, size, err := ReadArrayHeader(r.b[r.pos:])
	if err != nil {
		r.fail(err)
		return 0
	}
	if n > limit {
		r.fail(fmt.Errorf("%w: array of %d elements, limit %d", ErrTooLarge, n, limit))
		return 0
	}
	if n > len(r.b)-r.pos-size {
		r.fail(fmt.Errorf("%w: array of %d elements in %d bytes", ErrTruncated, n, len(r.b)-r.pos-size))
		return 0
	}
	r.pos += size
	r.field++
	return n
}

// bin reads a bin field of at most limit bytes and returns it aliasing the
// input, its capacity ending with it; an empty one is nil.
func (r *msgReader) bin(limit int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) == r.pos {
		r.fail(ErrTruncated)
		return nil
	}
	hdr, n, err := binLen(r.b[r.pos:])
	if err != nil {
		r.fail(err)
		return nil
	}
	if n > limit {
		r.fail(fmt.Errorf("%w: bin of %d bytes, limit %d", ErrTooLarge, n, limit))
		return nil
	}
	start, end := r.pos+hdr, r.pos+hdr+n
	r.pos = end
	r.field++
	if n == 0 {
		return nil
	}
	return r.b[start:end:end]
}

// bool reads a msgpack bool.
func (r *msgReader) bool() bool {
	if r.err != nil {
		return false
	}
	if len(r.b) == r.pos {
		r.fail(ErrTruncated)
		return false
	}
	var v bool
	switch c := r.b[r.pos]; c {
	case 0xc2:
	case 0xc3:
		v = true
	default:
		r.fail(fmt.Errorf("%w: code 0x%02x for bool", ErrMalformed, c))
		return false
	}
	r.pos++
	r.field++
	return v
}
