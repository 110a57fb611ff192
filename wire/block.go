package wire

import (
	"fmt"
	"math"
	"strconv"
)

// BlockKind says what the tuples of a Block are and so how the destination
// applies them. The numbers are part of the wire format; never renumber.
type BlockKind uint8

const (
	// BlockSnapshot: rows the table stream's cursor read (DESIGN.md step
	// 4). Inserted as they are; the destination's table held none of them.
	BlockSnapshot BlockKind = 1
	// BlockDeletes: keys of rows deleted behind the cursor, each a tuple of
	// the table's key columns (see AppendKey). Applied by key.
	BlockDeletes BlockKind = 2
	// BlockUpserts: the current rows of slots changed behind the cursor.
	// Applied by key, replacing any row with the same key.
	BlockUpserts BlockKind = 3
)

func (k BlockKind) String() string {
	switch k {
	case BlockSnapshot:
		return "snapshot"
	case BlockDeletes:
		return "deletes"
	case BlockUpserts:
		return "upserts"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Valid reports whether k is a known block kind.
func (k BlockKind) Valid() bool { return k >= BlockSnapshot && k <= BlockUpserts }

// Block carries rows or keys of one table, in the tuple format (tuple.go).
//
// Invariant: Tuples is a canonical msgpack array header for Count elements
// followed by Count canonical tuples, and nothing else; or Tuples is empty
// and Count is 0 (it then encodes as the empty array). DecodeMessage
// checks the structure (ScanTuples) but knows no schema; the receiver
// checks each tuple against its table with ScanTuple.
//
// A decoded Block's Tuples aliases the decoded payload (the frame, or the
// FrameDecoder's buffer for a compressed frame): copy what must outlive it.
type Block struct {
	MsgHeader
	Kind BlockKind
	// Table is the table the tuples belong to.
	Table uint32
	// Seq numbers the blocks of one rejoin from 1 upward, across tables
	// and kinds, in the order sent; Ack and Handoff.LastSeq refer to it.
	Seq    uint64
	Count  uint32
	Tuples []byte
}

// Type implements Message.
func (*Block) Type() MsgType { return MsgBlock }

// The encoding is [epoch, partition, kind, table, seq, tuples] with the
// array of tuples nested as the last field, so a block is one msgpack value
// any msgpack reader can print, and Count is the nested array's own header
// rather than a second copy that could disagree.
func (b *Block) appendTo(dst []byte) []byte {
	if !b.Kind.Valid() {
		panic(fmt.Sprintf("wire: Block of %v", b.Kind))
	}
	dst = appendBlockHead(dst, b.MsgHeader, b.Kind, b.Table, b.Seq)
	if len(b.Tuples) == 0 {
		if b.Count != 0 {
			panic(fmt.Sprintf("wire: Block.Count %d with no Tuples", b.Count))
		}
		return AppendArrayHeader(dst, 0)
	}
	// Checking the header is cheap; checking every tuple would be a second
	// pass over the block on the hot path, and the tuples come from our
	// own encoder or store.
	if n, _, err := ReadArrayHeader(b.Tuples); err != nil || n != int(b.Count) {
		panic(fmt.Sprintf("wire: Block.Count %d but Tuples has header for %d (%v)", b.Count, n, err))
	}
	return append(dst, b.Tuples...)
}

// appendBlockHead appends a Block's encoding up to its array of tuples.
func appendBlockHead(dst []byte, h MsgHeader, kind BlockKind, table uint32, seq uint64) []byte {
	dst = appendMsgHeader(dst, blockFields, h)
	dst = appendUint(dst, uint64(kind))
	dst = appendUint(dst, uint64(table))
	return appendUint(dst, seq)
}

// ScanTuples checks that b is exactly a block's tuple payload: a canonical
// array header for count elements, then count canonical tuples of scalar
// fields (int, float64, str, bin; at most TupleFieldsMax each), with nothing
// after. It knows no schema: the receiver checks each tuple against its
// table with ScanTuple. It allocates nothing.
func ScanTuples(b []byte, count int) error {
	n, size, err := scanTupleArray(b)
	if err != nil {
		return err
	}
	if n != count {
		return fmt.Errorf("%w: %d tuples, want %d", ErrMalformed, n, count)
	}
	if size != len(b) {
		return fmt.Errorf("%w: %d bytes after %d tuples", ErrMalformed, len(b)-size, n)
	}
	return nil
}

// scanTupleArray checks the array of tuples at the front of b and returns
// its element count and length.
func scanTupleArray(b []byte) (n, size int, err error) {
	n, pos, err := ReadArrayHeader(b)
	if err != nil {
		return 0, 0, err
	}
	for i := 0; i < n; i++ {
		l, err := scanTupleAny(b[pos:])
		if err != nil {
			return 0, 0, fmt.Errorf("%w (tuple %d at byte %d)", err, i, pos)
		}
		pos += l
	}
	return n, pos, nil
}

// blockHeadroomBytes is the room a BlockWriter leaves in front of the
// tuples: a frame header and the longest possible Block head, that is the
// array header, epoch, partition, kind, table, seq, and the array header of
// the tuples, each in its longest form.
const blockHeadroomBytes = FrameHeaderBytes + 1 + 9 + 5 + 1 + 5 + 9 + 5

// BlockWriter builds one Block frame with the tuples written once, in
// place. The tuples are appended behind a gap; when the block is done the
// writer knows the count, writes the Block's head and the frame header
// into the end of the gap, right before the tuples, and returns the frame
// from there. So an uncompressed block costs one copy of each tuple (from
// the store or the encoder into the writer) and a compressed one adds only
// the compressor's pass.
//
// Use: Reset, AppendTuple or AppendStored per row (stop when TupleBytes
// reaches the block budget), then Frame. A BlockWriter is reused from
// block to block and keeps its buffers; it is not safe for concurrent use.
type BlockWriter struct {
	buf   []byte // blockHeadroomBytes of gap, then the tuples
	count int
	ready bool // Reset was called

	head  MsgHeader
	kind  BlockKind
	table uint32
	seq   uint64

	out []byte // the compressed frame
}

// Reset starts a new block, dropping the previous one; a frame or Block
// the writer returned before is invalid from here on.
func (w *BlockWriter) Reset(h MsgHeader, kind BlockKind, table uint32, seq uint64) {
	if !kind.Valid() {
		panic(fmt.Sprintf("wire: BlockWriter.Reset with %v", kind))
	}
	if cap(w.buf) < blockHeadroomBytes {
		w.buf = make([]byte, blockHeadroomBytes, 64<<10)
	}
	w.buf = w.buf[:blockHeadroomBytes]
	w.count = 0
	w.ready = true
	w.head, w.kind, w.table, w.seq = h, kind, table, seq
}

// AppendTuple appends the canonical encoding of vals as the next tuple. On
// error (see TupleEncoder.AppendTuple) the block is unchanged.
func (w *BlockWriter) AppendTuple(vals []Value) error {
	var e TupleEncoder
	b, err := e.AppendTuple(w.buf, vals)
	if err != nil {
		return err
	}
	w.buf = b
	w.count++
	return nil
}

// AppendStored appends tuple, one whole canonical tuple as the partition
// stores it, byte for byte. It is not checked here: the store only holds
// tuples it checked or encoded itself, and the receiver checks every tuple
// against its schema.
func (w *BlockWriter) AppendStored(tuple []byte) {
	w.buf = append(w.buf, tuple...)
	w.count++
}

// Count returns the number of tuples appended since Reset.
func (w *BlockWriter) Count() int { return w.count }

// TupleBytes returns the bytes of the tuples appended since Reset, which is
// what a block budget such as 256 KiB counts.
func (w *BlockWriter) TupleBytes() int { return max(len(w.buf)-blockHeadroomBytes, 0) }

// finish writes the Block's head into the gap and returns where the
// message starts in buf and where its array of tuples starts.
func (w *BlockWriter) finish() (msgAt, tuplesAt int) {
	if !w.ready {
		panic("wire: BlockWriter used before Reset")
	}
	if uint64(w.count) > math.MaxUint32 {
		panic(fmt.Sprintf("wire: block of %d tuples", w.count))
	}
	var scratch [blockHeadroomBytes - FrameHeaderBytes]byte
	head := appendBlockHead(scratch[:0], w.head, w.kind, w.table, w.seq)
	fieldsLen := len(head)
	head = AppendArrayHeader(head, w.count)
	msgAt = blockHeadroomBytes - len(head)
	tuplesAt = msgAt + fieldsLen
	copy(w.buf[msgAt:], head)
	return msgAt, tuplesAt
}

// Block returns the block built so far as a Block whose Tuples aliases the
// writer's buffer, valid until the next Reset or append.
func (w *BlockWriter) Block() *Block {
	_, tuplesAt := w.finish()
	return &Block{
		MsgHeader: w.head,
		Kind:      w.kind,
		Table:     w.table,
		Seq:       w.seq,
		Count:     uint32(w.count),
		Tuples:    w.buf[tuplesAt:len(w.buf):len(w.buf)],
	}
}

// Frame finishes the block and returns it as one frame compressed with
// codec (see AppendFrame for when a frame goes out uncompressed instead).
// The frame aliases the writer's buffers and is valid until the next Reset
// or append; it may be called again after more appends.
func (w *BlockWriter) Frame(codec Codec) ([]byte, error) {
	if !codec.Valid() {
		return nil, fmt.Errorf("%w: %d", ErrUnknownCodec, uint8(codec))
	}
	msgAt, _ := w.finish()
	raw := w.buf[msgAt:]
	if len(raw) > FramePayloadRawBytesMax {
		return nil, fmt.Errorf("%w: block of %d bytes, limit %d", ErrTooLarge, len(raw), FramePayloadRawBytesMax)
	}
	if codec != CodecNone {
		var ok bool
		if w.out, ok = appendCompressedFrame(w.out[:0], MsgBlock, codec, raw); ok {
			return w.out, nil
		}
	}
	frame := w.buf[msgAt-FrameHeaderBytes:]
	sealFrame(frame, MsgBlock, CodecNone, len(raw))
	return frame, nil
}
