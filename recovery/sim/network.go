package sim

import (
	"errors"
	"fmt"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/wire"
)

// The simulated network. Every link is a FIFO with a delivery tick per
// item: an item is due at max(the previous item's tick, send tick +
// delay), so a link delivers in order, like a TCP connection, however the
// delays fall. Each tick the world delivers due items one at a time from
// a link drawn at random among those with one due, so links interleave
// differently on every seed while each keeps its order.

// link is one direction of delivery the world can pick from.
type link interface {
	// due reports whether the head item may be delivered at tick.
	due(tick uint64) bool
	// deliver delivers the head item.
	deliver(w *world)
}

// feedItem is a txn, a heartbeat or a join (Knobs.Joins) on its way
// from an initiator to one replica.
type feedItem struct {
	at  uint64
	inv partition.Invocation // Proc == "" for a heartbeat
	// join: the initiator's join of the partition (wire.Join); inv is
	// empty.
	join bool
}

// feedLink carries one initiator's (in) txns and heartbeats to one
// replica: a source replica (src) or an attempt's destination replica
// (to); to a source, the node's acks (wire.FeedAck) come back on it
// (feedbreak.go). Bound: the items sent and not delivered, at most
// FeedDelayMax ticks' worth; the acks, FeedAckDelayMax ticks' worth.
type feedLink struct {
	in   *initiator
	src  *srcReplica
	to   *attempt
	q    []feedItem
	last uint64
	// acks are on their way back, due in order; lastAck is the last's
	// tick.
	acks    []feedAck
	lastAck uint64
}

func (l *feedLink) send(w *world, inv partition.Invocation) {
	l.push(w, feedItem{inv: inv})
}

// sendJoin sends the initiator's join of the partition, in order with
// its txns and heartbeats, as on the node's one connection.
func (l *feedLink) sendJoin(w *world) {
	l.push(w, feedItem{join: true})
}

func (l *feedLink) push(w *world, it feedItem) {
	it.at = max(l.last, w.tick+uint64(w.delay(w.k.FeedDelayMax)))
	l.last = it.at
	l.q = append(l.q, it)
}

func (l *feedLink) due(tick uint64) bool { return len(l.q) > 0 && l.q[0].at <= tick }

func (l *feedLink) deliver(w *world) {
	it := l.q[0]
	l.q[0] = feedItem{}
	l.q = l.q[1:]
	if l.to == nil {
		if it.join {
			w.joinSource(l)
			return
		}
		w.feedSource(l, it.inv)
		return
	}
	w.feedDestination(l.to, it.inv)
}

// packet is some bytes of a frame stream in flight.
type packet struct {
	at uint64
	b  []byte
}

// pipe is one direction of a rejoin connection: messages go in as wire
// frames (a FrameEncoder with the run's codec) and come out through a
// FrameDecoder, so the encode, compress, checksum and decode paths all
// run. A frame may arrive in two packets; the receiver decodes whole
// frames only and keeps the rest.
//
// A pipe of an attempt (a != nil) delivers to that attempt's processor on
// the receiving side, once it is up. A ghost pipe (a == nil) models a late
// route of a cut attempt (its side keeps sending for a while before it
// learns of the cut): it delivers to whatever processor the receiving node
// runs when the message lands, and only if that processor belongs to a
// newer attempt, which must then reject it by its epoch.
type pipe struct {
	name   string
	a      *attempt
	toSrc  bool
	codec  wire.Codec
	enc    wire.FrameEncoder
	dec    wire.FrameDecoder
	q      []packet
	rx     []byte
	last   uint64
	frames int
}

func (p *pipe) send(w *world, m wire.Message, delayMax, minDelay int) {
	frame, err := p.enc.AppendFrame(nil, m, p.codec)
	if err != nil {
		w.violate("wire", "encode %s on %s: %v", m.Type(), p.name, err)
	}
	d := minDelay + w.delay(delayMax-minDelay)
	at := max(p.last, w.tick+uint64(d))
	p.last = at
	p.frames++
	w.stats.Frames++
	w.stats.FrameBytes += int64(len(frame))
	if len(frame) > 1 && w.net.IntN(100) < w.k.SplitPct {
		cut := 1 + w.net.IntN(len(frame)-1)
		p.q = append(p.q, packet{at: at, b: frame[:cut]}, packet{at: at, b: frame[cut:]})
		return
	}
	p.q = append(p.q, packet{at: at, b: frame})
}

// lose drops everything in flight, the half-received frame included: a cut
// connection delivers nothing more.
func (p *pipe) lose() int {
	n := len(p.q)
	p.q, p.rx = nil, nil
	return n
}

func (p *pipe) up() bool {
	if p.a == nil {
		return true
	}
	if p.a.x != nil {
		// With claims the connection is the source node's from its hello
		// on: the hello and its answer travel on it.
		return !p.a.dstGone
	}
	if p.toSrc {
		return p.a.src != nil
	}
	return p.a.dst != nil && !p.a.dstGone
}

func (p *pipe) due(tick uint64) bool { return len(p.q) > 0 && p.q[0].at <= tick && p.up() }

func (p *pipe) deliver(w *world) {
	pk := p.q[0]
	p.q[0] = packet{}
	p.q = p.q[1:]
	p.rx = append(p.rx, pk.b...)
	for len(p.rx) > 0 {
		m, n, err := p.dec.DecodeFrame(p.rx)
		if errors.Is(err, wire.ErrTruncated) {
			return // the rest of the frame is in the next packet
		}
		if err != nil {
			w.violate("wire", "decode on %s: %v", p.name, err)
		}
		// The message may alias rx or the decoder's buffer: it is handled
		// before either is touched again.
		if p.a == nil {
			w.onGhost(p, m)
		} else {
			w.onConn(p, m)
		}
		if p.rx == nil {
			return // the handler cut this connection
		}
		p.rx = p.rx[n:]
	}
	p.rx = p.rx[:0]
}

// delay draws a delay of 0..n ticks.
func (w *world) delay(n int) int {
	if n <= 0 {
		return 0
	}
	return w.net.IntN(n + 1)
}

// describe renders a message for the trace.
func (w *world) describe(m wire.Message) string {
	h := m.Header()
	switch m := m.(type) {
	case *wire.Propose:
		return fmt.Sprintf("propose e%d P=%v", h.Epoch, m.TxnID)
	case *wire.Answer:
		return fmt.Sprintf("answer e%d S=%v", h.Epoch, m.TxnID)
	case *wire.Block:
		if w.scripted {
			return fmt.Sprintf("block e%d #%d %s %s %v", h.Epoch, m.Seq, m.Kind, w.tableName(m.Table), w.blockKeys(m))
		}
		return fmt.Sprintf("block e%d #%d %s %s rows=%d bytes=%d", h.Epoch, m.Seq, m.Kind, w.tableName(m.Table), m.Count, len(m.Tuples))
	case *wire.Ack:
		return fmt.Sprintf("ack e%d #%d", h.Epoch, m.Seq)
	case *wire.Handoff:
		return fmt.Sprintf("handoff e%d E=%v rows=%d last=#%d", h.Epoch, m.TxnID, m.Rows, m.LastSeq)
	case *wire.HandoffAck:
		return fmt.Sprintf("handoff-ack e%d E=%v", h.Epoch, m.TxnID)
	case *wire.Abort:
		return fmt.Sprintf("abort e%d %s: %s", h.Epoch, m.Reason, m.Text)
	case *wire.Heartbeat:
		return fmt.Sprintf("heartbeat e%d", h.Epoch)
	case *wire.Hello:
		return fmt.Sprintf("hello e%d from %s", m.Epoch, m.Node)
	case *wire.Reply:
		return fmt.Sprintf("refusal: %s", m.Err)
	}
	return fmt.Sprintf("%s e%d", m.Type(), h.Epoch)
}

func (w *world) tableName(id uint32) string {
	if id >= 1 && int(id) <= len(w.schemas) {
		return w.schemas[id-1].Name
	}
	return fmt.Sprintf("table%d", id)
}

// feedCore gives a node's replica core a txn, or with proc "" a
// heartbeat. If the core did not take it in (it failed the replica, or
// ended its attempt), it says why.
func feedCore(core *recovery.Replica, inv partition.Invocation) (why string) {
	var ok bool
	if inv.Proc == "" {
		ok = core.OnHeartbeat(inv.ID)
	} else {
		ok = core.OnTxn(inv)
	}
	if ok {
		return ""
	}
	why = "dropped"
	if inv.Proc == "" {
		// A heartbeat at or below the floor the initiator was tracked
		// from, sent before it read its join's answer: dropped, not a
		// failure (Replica.OnHeartbeat), unless the outbox says one.
		why = ""
	}
	for _, o := range core.Outbox() {
		switch {
		case o.Kind == recovery.OutFailed:
			why = o.Why
		case o.Kind == recovery.OutDestinationEnded && o.Err != nil:
			why = o.Err.Error()
		}
	}
	return why
}

// feedSource delivers a txn or heartbeat on l to a source replica, and to
// nothing else: the oracle got it when it was sent. A dead node takes
// nothing; a live one reads it even if its replica failed.
func (w *world) feedSource(l *feedLink, inv partition.Invocation) {
	sr := l.src
	if sr.dead {
		return
	}
	w.readFeed(l, inv.ID)
	if sr.out() {
		return
	}
	if !sr.core.Tracks(l.in.id) {
		// Not joined here yet (Knobs.Joins): the node's replica reads no
		// heartbeat of it. The initiator sends a txn of the partition
		// before its join's answer only to a node out of its view, whose
		// replica refuses it and fails (recovery.Initiator's join).
		if inv.Proc != "" {
			if _, inView := w.view.Nodes[sr.id]; inView {
				w.violate("feed", "source %s got txn %v of initiator %d, which it does not track", sr.id, inv.ID, l.in.id)
			}
			w.failSource(sr, fmt.Sprintf("txn %v of initiator %d, which it does not track", inv.ID, l.in.id))
		}
		return
	}
	if why := feedCore(sr.core, inv); why != "" {
		w.violate("feed", "source refused %v: %s", inv.ID, why)
	}
	sr.keepTail(inv)
	w.noteTook(sr.id, inv)
}

// offer gives an executor a txn, or with proc "" a heartbeat.
func offer(e *partition.Executor, inv partition.Invocation) error {
	if inv.Proc == "" {
		return e.Heartbeat(inv.ID)
	}
	return e.Offer(inv)
}

// feedDestination delivers a txn or heartbeat to an attempt's destination
// replica, through the node's replica core and its processor (which
// buffers until it goes live, and takes a late txn below E as a
// heartbeat after). Nothing may be refused: a refusal ends the attempt,
// or fails the live replica.
func (w *world) feedDestination(a *attempt, inv partition.Invocation) {
	if a.dst == nil || a.dstGone || w.dst.Destination() != a.dst {
		return // the replica is gone (aborted, superseded); its link is dropped with it
	}
	if in := inv.ID.Initiator(); !w.dst.Tracks(in) {
		// Not joined here yet (Knobs.Joins), as at a source node.
		if inv.Proc != "" {
			w.violate("feed", "destination e%d got txn %v of initiator %d, which it does not track", a.epoch, inv.ID, in)
		}
		return
	}
	if why := feedCore(w.dst, inv); why != "" {
		w.violate("feed", "destination e%d (%s) refused %v: %s", a.epoch, a.dst.State(), inv.ID, why)
	}
	keepTail(&w.dstTails, inv)
	w.noteTook(dstNode, inv)
	w.afterCall(a)
}

// inFeed reports whether a's destination replica is in the feed: from its
// attempt's start on, until it aborts, its node restarts or it is dropped
// as a duplicate. Without claims that is the newest attempt's alone; a
// paused executor's replica stays in it (its links hold what comes).
func (w *world) inFeed(a *attempt) bool {
	return a.feed != nil && a.dst != nil && !a.dstGone && a.dst.State() != recovery.StateAborted
}

// blockKeys lists the keys a block carries, for a script's output.
func (w *world) blockKeys(m *wire.Block) []string {
	if m.Table < 1 || int(m.Table) > len(w.schemas) {
		return nil
	}
	s := w.schemas[m.Table-1]
	types := s.Types()
	if m.Kind == wire.BlockDeletes {
		types = types[:0:0]
		for _, c := range s.Key {
			types = append(types, s.Columns[c].Type)
		}
	}
	b := m.Tuples
	n, hdr := arrayHeader(b)
	b = b[hdr:]
	var keys []string
	for i := 0; i < n; i++ {
		vals, used, err := wire.DecodeTuple(b, types, nil)
		if err != nil {
			return append(keys, "?"+err.Error())
		}
		b = b[used:]
		if m.Kind != wire.BlockDeletes {
			key := make([]wire.Value, len(s.Key))
			for j, c := range s.Key {
				key[j] = vals[c]
			}
			vals = key
		}
		keys = append(keys, keyName(vals))
	}
	return keys
}

// arrayHeader reads a msgpack array header: the element count and the
// header's length (0, 0 if b holds none).
func arrayHeader(b []byte) (n, size int) {
	switch {
	case len(b) >= 1 && b[0]&0xf0 == 0x90:
		return int(b[0] & 0x0f), 1
	case len(b) >= 3 && b[0] == 0xdc:
		return int(b[1])<<8 | int(b[2]), 3
	case len(b) >= 5 && b[0] == 0xdd:
		return int(b[1])<<24 | int(b[2])<<16 | int(b[3])<<8 | int(b[4]), 5
	}
	return 0, 0
}
