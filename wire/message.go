package wire

import (
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/rejoin-db/rejoin/txnid"
)

// MsgType names the message a frame carries. The numbers are part of the
// wire format; never renumber.
type MsgType uint8

// The messages of the rejoin protocol, in the order a rejoin uses them
// (DESIGN.md steps 3-8).
const (
	MsgPropose   MsgType = 1 // destination -> source: proposed txn ID P
	MsgAnswer    MsgType = 2 // source -> destination: start txn ID S
	MsgBlock     MsgType = 3 // source -> destination: snapshot or catch-up rows
	MsgAck       MsgType = 4 // destination -> source: blocks applied up to Seq
	MsgHandoff   MsgType = 5 // source -> destination: txn ID E and digest
	MsgAbort     MsgType = 6 // either way: the rejoin is over, why
	MsgHeartbeat MsgType = 7 // either way: keepalive while nothing else flows
)

// The cluster messages (cluster.go): connection setup, the txn feed,
// client calls and the repair of a dead initiator's tail. They carry no
// MsgHeader.
const (
	MsgHello     MsgType = 8  // dialer -> node, then node -> dialer: what the connection is for
	MsgTxn       MsgType = 9  // initiator -> replica: one txn of the feed
	MsgBeat      MsgType = 10 // initiator -> replica: nothing below ID follows
	MsgDone      MsgType = 11 // replica -> initiator: the result of one txn
	MsgCall      MsgType = 12 // client -> node: run a procedure
	MsgReply     MsgType = 13 // node -> client: the result of a Call
	MsgRepair    MsgType = 14 // replica -> replica: send a dead initiator's txns after ID
	MsgRepairEnd MsgType = 15 // replica -> replica: end of the Txns answering a Repair
)

// Rejoin messages added after the cluster messages.
const (
	MsgHold       MsgType = 16 // destination -> source: my buffer is past its hold mark, hold execution
	MsgHandoffAck MsgType = 17 // destination -> source: live at E with this digest
)

// Cluster messages added after the late rejoin messages.
const (
	MsgBeatAsk MsgType = 18 // initiator -> initiator's node: beat above ID on every feed
	MsgFeedAck MsgType = 19 // replica node -> initiator: the feed's messages up to ID are here
	MsgFenced  MsgType = 20 // replica node -> initiator: your process was taken for dead here
	MsgJoin    MsgType = 21 // initiator -> replica node: track me for this partition
	MsgJoined  MsgType = 22 // replica node -> initiator: tracked, with the partition's floor
)

func (t MsgType) String() string {
	switch t {
	case MsgPropose:
		return "Propose"
	case MsgAnswer:
		return "Answer"
	case MsgBlock:
		return "Block"
	case MsgAck:
		return "Ack"
	case MsgHandoff:
		return "Handoff"
	case MsgAbort:
		return "Abort"
	case MsgHeartbeat:
		return "Heartbeat"
	case MsgHello:
		return "Hello"
	case MsgTxn:
		return "Txn"
	case MsgBeat:
		return "Beat"
	case MsgDone:
		return "Done"
	case MsgCall:
		return "Call"
	case MsgReply:
		return "Reply"
	case MsgRepair:
		return "Repair"
	case MsgRepairEnd:
		return "RepairEnd"
	case MsgHold:
		return "Hold"
	case MsgHandoffAck:
		return "HandoffAck"
	case MsgBeatAsk:
		return "BeatAsk"
	case MsgFeedAck:
		return "FeedAck"
	case MsgFenced:
		return "Fenced"
	case MsgJoin:
		return "Join"
	case MsgJoined:
		return "Joined"
	}
	return "MsgType(" + strconv.Itoa(int(t)) + ")"
}

// Valid reports whether t is a known message type.
func (t MsgType) Valid() bool { return t >= MsgPropose && t <= MsgJoined }

// Rejoin reports whether t is a message of the rejoin protocol (Propose to
// Heartbeat, Hold and HandoffAck), which has a MsgHeader, as opposed to a
// cluster message.
func (t MsgType) Rejoin() bool {
	return t >= MsgPropose && t <= MsgHeartbeat || t == MsgHold || t == MsgHandoffAck
}

// MsgHeader is what every message of a rejoin carries, so that a receiver
// can drop a message of a superseded attempt (DESIGN.md step 1) before
// looking at anything else. It is encoded as the first two fields of every
// message.
type MsgHeader struct {
	// Epoch is the fencing epoch of the rejoin's claim. Receivers reject
	// an epoch lower than the highest they have seen; wire does not look.
	Epoch uint64
	// Partition is the partition being rejoined.
	Partition uint32
}

// Header returns h; every message embeds MsgHeader and so has this method.
func (h MsgHeader) Header() MsgHeader { return h }

// Message is one message of the rejoin protocol or of the cluster. The
// implementations are the pointer types *Propose, *Answer, *Block, *Ack,
// *Handoff, *Abort, *Heartbeat, *Hold and *HandoffAck (the rejoin messages), and *Hello, *Txn,
// *Beat, *BeatAsk, *FeedAck, *Fenced, *Done, *Call, *Reply, *Repair and *RepairEnd (the
// cluster messages, cluster.go);
// DecodeMessage returns one of them and AppendMessage takes one.
//
// Header is the rejoin attempt's fencing header. A cluster message has
// none and returns the zero MsgHeader, so it must never reach a rejoin
// processor, whose fencing would read it as partition 0, epoch 0: route by
// Type().Rejoin() first.
type Message interface {
	Type() MsgType
	Header() MsgHeader
}

// Field counts of each message's msgpack array, header fields included.
// Part of the format: a message with another count is ErrMalformed.
const (
	headerFields     = 2
	proposeFields    = headerFields + 1
	answerFields     = headerFields + 2
	blockFields      = headerFields + 4
	ackFields        = headerFields + 1
	handoffFields    = headerFields + 5
	abortFields      = headerFields + 2
	heartbeatFields  = headerFields + 1
	holdFields       = headerFields
	handoffAckFields = headerFields + 2
)

// AppendMessage appends the encoding of m to dst: a msgpack array of the
// message's fields in declaration order, header first, each in its
// shortest form. The message type is not in these bytes; the frame carries
// it. AppendMessage panics if m is not one of this package's messages, is
// a Block whose Tuples and Count disagree or is a Block or Hello of an
// invalid kind: all bugs in the caller. It cuts error texts (Abort.Text,
// the Err of Done, Reply, ReplicaOut and RepairEnd) to their limit, but
// encodes other over-limit cluster fields as they are, which DecodeMessage
// then refuses: AppendFrame checks those limits first and returns
// ErrTooLarge.
func AppendMessage(dst []byte, m Message) []byte {
	switch m := m.(type) {
	case *Propose:
		dst = appendMsgHeader(dst, proposeFields, m.MsgHeader)
		return appendUint(dst, uint64(m.TxnID))
	case *Answer:
		dst = appendMsgHeader(dst, answerFields, m.MsgHeader)
		dst = appendUint(dst, uint64(m.TxnID))
		return appendUint(dst, m.Rows)
	case *Block:
		return m.appendTo(dst)
	case *Ack:
		dst = appendMsgHeader(dst, ackFields, m.MsgHeader)
		return appendUint(dst, m.Seq)
	case *Handoff:
		dst = appendMsgHeader(dst, handoffFields, m.MsgHeader)
		dst = appendUint(dst, uint64(m.TxnID))
		dst = appendUint(dst, m.Digest)
		dst = appendUint(dst, m.LastSeq)
		dst = appendUint(dst, m.Rows)
		dst = AppendArrayHeader(dst, len(m.Initiators))
		for _, in := range m.Initiators {
			dst = appendUint(dst, uint64(in))
		}
		return dst
	case *Abort:
		dst = appendMsgHeader(dst, abortFields, m.MsgHeader)
		dst = appendUint(dst, uint64(m.Reason))
		text := truncateText(m.Text, AbortTextBytesMax)
		return append(appendStrHeader(dst, len(text)), text...)
	case *Heartbeat:
		dst = appendMsgHeader(dst, heartbeatFields, m.MsgHeader)
		return appendUint(dst, m.Tick)
	case *Hold:
		return appendMsgHeader(dst, holdFields, m.MsgHeader)
	case *HandoffAck:
		dst = appendMsgHeader(dst, handoffAckFields, m.MsgHeader)
		dst = appendUint(dst, uint64(m.TxnID))
		return appendUint(dst, m.Digest)
	}
	if out, ok := appendCluster(dst, m); ok {
		return out
	}
	panic(fmt.Sprintf("wire: AppendMessage of %T", m))
}

func appendMsgHeader(dst []byte, fields int, h MsgHeader) []byte {
	dst = AppendArrayHeader(dst, fields)
	dst = appendUint(dst, h.Epoch)
	return appendUint(dst, uint64(h.Partition))
}

// DecodeMessage decodes the payload of a message of type t. It accepts
// exactly the bytes AppendMessage writes: the right field count, every
// field in its shortest form, nothing after the last field, so that
// AppendMessage of the result gives payload back byte for byte. It never
// panics and allocates only the message itself and its strings (an
// Abort's text, a cluster message's node, procedure and error texts, each
// under its limit) and a Reply's Each (at most ReplicaOutsMax entries). A
// decoded Block's Tuples, and a cluster message's Params and Out, alias
// payload.
func DecodeMessage(t MsgType, payload []byte) (Message, error) {
	r := msgReader{b: payload}
	var m Message
	switch t {
	case MsgPropose:
		var p Propose
		r.header(proposeFields, &p.MsgHeader)
		p.TxnID = r.txnID()
		m = &p
	case MsgAnswer:
		var a Answer
		r.header(answerFields, &a.MsgHeader)
		a.TxnID = r.txnID()
		a.Rows = r.uint(math.MaxUint64)
		m = &a
	case MsgBlock:
		var b Block
		r.header(blockFields, &b.MsgHeader)
		b.Kind = BlockKind(r.uint(math.MaxUint8))
		if r.err == nil && !b.Kind.Valid() {
			r.fail(fmt.Errorf("%w: block kind %d", ErrMalformed, b.Kind))
		}
		b.Table = uint32(r.uint(math.MaxUint32))
		b.Seq = r.uint(math.MaxUint64)
		b.Count, b.Tuples = r.tuples()
		m = &b
	case MsgAck:
		var a Ack
		r.header(ackFields, &a.MsgHeader)
		a.Seq = r.uint(math.MaxUint64)
		m = &a
	case MsgHandoff:
		var h Handoff
		r.header(handoffFields, &h.MsgHeader)
		h.TxnID = r.txnID()
		h.Digest = r.uint(math.MaxUint64)
		h.LastSeq = r.uint(math.MaxUint64)
		h.Rows = r.uint(math.MaxUint64)
		h.Initiators = r.initiators()
		m = &h
	case MsgAbort:
		var a Abort
		r.header(abortFields, &a.MsgHeader)
		a.Reason = AbortReason(r.uint(math.MaxUint8))
		a.Text = r.str(AbortTextBytesMax)
		m = &a
	case MsgHeartbeat:
		var h Heartbeat
		r.header(heartbeatFields, &h.MsgHeader)
		h.Tick = r.uint(math.MaxUint64)
		m = &h
	case MsgHold:
		var h Hold
		r.header(holdFields, &h.MsgHeader)
		m = &h
	case MsgHandoffAck:
		var h HandoffAck
		r.header(handoffAckFields, &h.MsgHeader)
		h.TxnID = r.txnID()
		h.Digest = r.uint(math.MaxUint64)
		m = &h
	default:
		if m = decodeCluster(t, &r); m == nil {
			return nil, fmt.Errorf("%w: %d", ErrUnknownType, uint8(t))
		}
	}
	if r.err == nil && r.pos != len(r.b) {
		r.fail(fmt.Errorf("%w: %d bytes after the last field", ErrMalformed, len(r.b)-r.pos))
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w (%v, field %d, byte %d)", r.err, t, r.field, r.pos)
	}
	return m, nil
}

// msgReader reads the fields of one message. The first error sticks and
// turns every later read into a no-op returning zero, so DecodeMessage
// reads a message straight through and checks once.
type msgReader struct {
	b     []byte
	pos   int
	field int // index of the field being read, for error text
	err   error
}

func (r *msgReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// header reads the array header, which must announce exactly fields
// elements, and the MsgHeader fields.
func (r *msgReader) header(fields int, h *MsgHeader) {
	n, size, err := ReadArrayHeader(r.b)
	if err != nil {
		r.fail(err)
		return
	}
	if n != fields {
		r.fail(fmt.Errorf("%w: %d fields, want %d", ErrMalformed, n, fields))
		return
	}
	r.pos = size
	h.Epoch = r.uint(math.MaxUint64)
	h.Partition = uint32(r.uint(math.MaxUint32))
}

// uint reads an unsigned field no larger than limit.
func (r *msgReader) uint(limit uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n, err := readUint(r.b[r.pos:])
	if err != nil {
		r.fail(err)
		return 0
	}
	if v > limit {
		r.fail(fmt.Errorf("%w: %d over %d", ErrMalformed, v, limit))
		return 0
	}
	r.pos += n
	r.field++
	return v
}

func (r *msgReader) txnID() txnid.ID { return txnid.ID(r.uint(math.MaxUint64)) }

// initiators reads an array of initiators, each below
// txnid.InitiatorsMax and above the one before (nil if empty).
func (r *msgReader) initiators() []txnid.Initiator {
	n := r.array(txnid.InitiatorsMax)
	if n == 0 {
		return nil
	}
	out := make([]txnid.Initiator, 0, n)
	for range n {
		in := txnid.Initiator(r.uint(txnid.InitiatorsMax - 1))
		if r.err != nil {
			return nil
		}
		if len(out) > 0 && in <= out[len(out)-1] {
			r.fail(fmt.Errorf("%w: initiator %d after %d, want increasing", ErrMalformed, in, out[len(out)-1]))
			return nil
		}
		out = append(out, in)
	}
	return out
}

// partitions reads an array of at most limit partition ids, each above
// the one before (nil if empty).
func (r *msgReader) partitions(limit int) []uint32 {
	n := r.array(limit)
	if n == 0 {
		return nil
	}
	out := make([]uint32, 0, n)
	for range n {
		p := uint32(r.uint(math.MaxUint32))
		if r.err != nil {
			return nil
		}
		if len(out) > 0 && p <= out[len(out)-1] {
			r.fail(fmt.Errorf("%w: partition %d after %d, want increasing", ErrMalformed, p, out[len(out)-1]))
			return nil
		}
		out = append(out, p)
	}
	return out
}

// str reads a str field of at most limit bytes; the length is checked
// before the string is allocated.
func (r *msgReader) str(limit int) string {
	if r.err != nil {
		return ""
	}
	if len(r.b) == r.pos {
		r.fail(ErrTruncated)
		return ""
	}
	hdr, n, err := strLen(r.b[r.pos:])
	if err != nil {
		r.fail(err)
		return ""
	}
	if n > limit {
		r.fail(fmt.Errorf("%w: string of %d bytes, limit %d", ErrTooLarge, n, limit))
		return ""
	}
	s := string(r.b[r.pos+hdr : r.pos+hdr+n])
	r.pos += hdr + n
	r.field++
	return s
}

// tuples reads a block's array of tuples, checking its structure (see
// ScanTuples), and returns its count and its bytes, header included,
// aliasing the input. The slice's capacity ends with it, so a caller's
// append cannot overwrite what follows.
func (r *msgReader) tuples() (uint32, []byte) {
	if r.err != nil {
		return 0, nil
	}
	n, size, err := scanTupleArray(r.b[r.pos:])
	if err != nil {
		r.fail(err)
		return 0, nil
	}
	end := r.pos + size
	t := r.b[r.pos:end:end]
	r.pos = end
	r.field++
	// ReadArrayHeader reads at most a uint32 count.
	return uint32(n), t
}

// truncateText cuts s to at most limit bytes without splitting a UTF-8
// sequence, so that a long error text still fits an Abort.
func truncateText(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && cut > limit-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
