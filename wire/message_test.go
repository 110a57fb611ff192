package wire

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range sampleMessages(t) {
		t.Run(m.Type().String(), func(t *testing.T) {
			b := AppendMessage(nil, m)
			got, err := DecodeMessage(m.Type(), b)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("got %+v, want %+v", got, m)
			}
			if again := AppendMessage(nil, got); !bytes.Equal(again, b) {
				t.Fatalf("re-encoding differs:\n%x\n%x", again, b)
			}
			if got.Header() != m.Header() {
				t.Fatalf("header %+v, want %+v", got.Header(), m.Header())
			}
			// Any msgpack reader sees an array of the message's fields.
			var generic []any
			if err := msgpack.Unmarshal(b, &generic); err != nil {
				t.Fatalf("msgpack rejects our message: %v", err)
			}
			if n, _, _ := ReadArrayHeader(b); len(generic) != n {
				t.Fatalf("msgpack sees %d fields, want %d", len(generic), n)
			}
			if e, _ := msgpackUint(generic[0]); e != m.Header().Epoch {
				t.Fatalf("msgpack sees epoch %v", generic[0])
			}
		})
	}
}

func msgpackUint(v any) (uint64, bool) {
	switch v := v.(type) {
	case int8:
		return uint64(v), v >= 0
	case uint8:
		return uint64(v), true
	case uint16:
		return uint64(v), true
	case uint32:
		return uint64(v), true
	case uint64:
		return v, true
	}
	return 0, false
}

func TestBlockMsgpackView(t *testing.T) {
	b := AppendMessage(nil, compressibleBlock(t))
	var generic []any
	if err := msgpack.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	rows, ok := generic[5].([]any)
	if !ok || len(rows) != 40 {
		t.Fatalf("tuples field is %T of %d", generic[5], len(rows))
	}
	if row, ok := rows[1].([]any); !ok || len(row) != 4 || row[2] != "row-b" {
		t.Fatalf("row 1 reads as %#v", rows[1])
	}
}

func TestEmptyBlock(t *testing.T) {
	m := &Block{Kind: BlockDeletes, Table: 1, Seq: 1}
	b := AppendMessage(nil, m)
	got, err := DecodeMessage(MsgBlock, b)
	if err != nil {
		t.Fatal(err)
	}
	blk := got.(*Block)
	if blk.Count != 0 || !bytes.Equal(blk.Tuples, []byte{0x90}) {
		t.Fatalf("empty block decodes as %+v", blk)
	}
}

// patch returns a copy of b with b[i] = v.
func patch(b []byte, i int, v ...byte) []byte {
	c := bytes.Clone(b)
	copy(c[i:], v)
	return c
}

func TestDecodeMessageErrors(t *testing.T) {
	h := MsgHeader{Epoch: 5, Partition: 6}
	ack := AppendMessage(nil, &Ack{MsgHeader: h, Seq: 7}) // 93 05 06 07
	if !bytes.Equal(ack, []byte{0x93, 5, 6, 7}) {
		t.Fatalf("ack is %x", ack)
	}
	block := func(tuples ...byte) []byte {
		return append([]byte{0x96, 5, 6, byte(BlockSnapshot), 1, 1}, tuples...)
	}
	longText := AppendMessage(nil, &Abort{MsgHeader: h, Text: strings.Repeat("x", AbortTextBytesMax)})
	longText = append(longText[:len(longText)-AbortTextBytesMax-3], 0xda, 0x02, 0x01)
	longText = append(longText, strings.Repeat("x", AbortTextBytesMax+1)...)

	// Handoff [5, 6, E 1, digest 2, lastSeq 3, rows 4, initiators...]
	handoff := func(initiators ...byte) []byte {
		return append([]byte{0x97, 5, 6, 1, 2, 3, 4}, initiators...)
	}

	tests := []struct {
		name    string
		t       MsgType
		payload []byte
		want    error
	}{
		{"unknown type 0", 0, ack, ErrUnknownType},
		{"handoff without initiators", MsgHandoff, []byte{0x96, 5, 6, 1, 2, 3, 4}, ErrMalformed},
		{"handoff initiators not an array", MsgHandoff, handoff(1), ErrMalformed},
		{"handoff initiators out of order", MsgHandoff, handoff(0x92, 2, 1), ErrMalformed},
		{"handoff initiator twice", MsgHandoff, handoff(0x92, 2, 2), ErrMalformed},
		{"handoff initiator past the range", MsgHandoff, handoff(0x91, 0xcd, 0x04, 0x00), ErrMalformed},
		{"handoff initiators past end", MsgHandoff, handoff(0x93, 1, 2), ErrTruncated},
		{"unknown type 23", 23, ack, ErrUnknownType},
		{"unknown type 255", 255, ack, ErrUnknownType},
		{"empty", MsgAck, nil, ErrTruncated},
		{"not an array", MsgAck, []byte{0x05}, ErrMalformed},
		{"map", MsgAck, []byte{0x83, 5, 6, 7}, ErrMalformed},
		{"too few fields", MsgAck, []byte{0x92, 5, 6}, ErrMalformed},
		{"too many fields", MsgAck, []byte{0x94, 5, 6, 7, 8}, ErrMalformed},
		{"trailing byte", MsgAck, append(bytes.Clone(ack), 0), ErrMalformed},
		{"array16 header", MsgAck, []byte{0xdc, 0, 3, 5, 6, 7}, ErrNonCanonical},
		{"uint8 for 5", MsgAck, patch(ack, 1, 0xcc, 5), ErrNonCanonical},
		{"uint64 for 7", MsgAck, []byte{0x93, 5, 6, 0xcf, 0, 0, 0, 0, 0, 0, 0, 7}, ErrNonCanonical},
		{"signed int", MsgAck, []byte{0x93, 5, 6, 0xd0, 0x80}, ErrMalformed},
		{"negative fixint", MsgAck, []byte{0x93, 5, 6, 0xff}, ErrMalformed},
		{"nil field", MsgAck, []byte{0x93, 5, 6, 0xc0}, ErrMalformed},
		{"str field", MsgAck, []byte{0x93, 5, 6, 0xa1, '7'}, ErrMalformed},
		{"partition over uint32", MsgAck, []byte{0x93, 5, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0, 7}, ErrMalformed},
		{"uint32 cut short", MsgAck, []byte{0x93, 5, 6, 0xce, 1, 2}, ErrTruncated},
		{"abort reason over uint8", MsgAbort, []byte{0x94, 5, 6, 0xcd, 1, 0, 0xa0}, ErrMalformed},
		{"abort text too long", MsgAbort, longText, ErrTooLarge},
		{"abort text not str", MsgAbort, []byte{0x94, 5, 6, 1, 0xc4, 0}, ErrMalformed},
		{"abort text str8 of 3", MsgAbort, []byte{0x94, 5, 6, 1, 0xd9, 3, 'a', 'b', 'c'}, ErrNonCanonical},
		{"abort text past end", MsgAbort, []byte{0x94, 5, 6, 1, 0xa5, 'a'}, ErrTruncated},
		{"block kind 0", MsgBlock, patch(block(0x90), 3, 0), ErrMalformed},
		{"block kind 4", MsgBlock, patch(block(0x90), 3, 4), ErrMalformed},
		{"block tuples not an array", MsgBlock, block(0xc4, 0), ErrMalformed},
		{"block tuples missing", MsgBlock, block(), ErrTruncated},
		{"block count over content", MsgBlock, block(0x92, 0x91, 1), ErrTruncated},
		{"block array32 count huge", MsgBlock, block(0xdd, 0xff, 0xff, 0xff, 0xff, 0x90), ErrTruncated},
		{"block trailing after tuples", MsgBlock, block(0x91, 0x91, 1, 0x91), ErrMalformed},
		{"block tuple not an array", MsgBlock, block(0x91, 0x01), ErrMalformed},
		{"block tuple nil field", MsgBlock, block(0x91, 0x91, 0xc0), ErrMalformed},
		{"block tuple bool field", MsgBlock, block(0x91, 0x91, 0xc3), ErrMalformed},
		{"block tuple float32 field", MsgBlock, block(0x91, 0x91, 0xca, 0, 0, 0, 0), ErrMalformed},
		{"block tuple nested array", MsgBlock, block(0x91, 0x91, 0x90), ErrMalformed},
		{"block tuple map field", MsgBlock, block(0x91, 0x91, 0x80), ErrMalformed},
		{"block tuple ext field", MsgBlock, block(0x91, 0x91, 0xd4, 1, 1), ErrMalformed},
		{"block tuple uint64 over int64", MsgBlock, block(0x91, 0x91, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0), ErrMalformed},
		{"block tuple non-canonical int", MsgBlock, block(0x91, 0x91, 0xd3, 0, 0, 0, 0, 0, 0, 0, 1), ErrNonCanonical},
		{"block tuple non-canonical bin", MsgBlock, block(0x91, 0x91, 0xc5, 0, 1, 'x'), ErrNonCanonical},
		{"block tuple bin past end", MsgBlock, block(0x91, 0x91, 0xc4, 9, 'x'), ErrTruncated},
		{"block tuple float cut short", MsgBlock, block(0x91, 0x91, 0xcb, 0), ErrTruncated},
		{"block tuple too many fields", MsgBlock, block(append([]byte{0x91, 0xdc, 0x10, 0x01}, make([]byte, TupleFieldsMax+1)...)...), ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := DecodeMessage(tt.t, tt.payload)
			if !errors.Is(err, tt.want) {
				t.Fatalf("DecodeMessage(%v, %x) = %v, %v; want %v", tt.t, tt.payload, m, err, tt.want)
			}
			if m != nil {
				t.Fatalf("message %v with error", m)
			}
			if !strings.HasPrefix(err.Error(), "wire: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
		})
	}
}

// Every proper prefix of a valid message ends inside a field, and is
// reported as such, never as another class and never as a success.
func TestDecodeMessagePrefixes(t *testing.T) {
	for _, m := range allSampleMessages(t) {
		b := AppendMessage(nil, m)
		for cut := range len(b) {
			if _, err := DecodeMessage(m.Type(), b[:cut]); !errors.Is(err, ErrTruncated) {
				t.Fatalf("%v cut at %d of %d: %v, want ErrTruncated", m.Type(), cut, len(b), err)
			}
		}
	}
}

func TestAppendMessagePanicsOnBugs(t *testing.T) {
	tuples := sampleTuples(t, 2)
	for name, m := range map[string]Message{
		"count mismatch":        &Block{Kind: BlockSnapshot, Count: 3, Tuples: tuples},
		"count without tuples":  &Block{Kind: BlockSnapshot, Count: 1},
		"tuples without header": &Block{Kind: BlockSnapshot, Count: 1, Tuples: []byte{0xc4}},
		"invalid kind":          &Block{Kind: 0, Count: 2, Tuples: tuples},
		"foreign message":       foreign{},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			AppendMessage(nil, m)
		})
	}
}

type foreign struct{ MsgHeader }

func (foreign) Type() MsgType { return MsgAck }

func TestAbortTextCut(t *testing.T) {
	for _, pad := range []int{0, 1, 2, 3} {
		text := strings.Repeat("a", pad) + strings.Repeat("é€😀", AbortTextBytesMax)
		b := AppendMessage(nil, &Abort{Reason: AbortTimeout, Text: text})
		m, err := DecodeMessage(MsgAbort, b)
		if err != nil {
			t.Fatal(err)
		}
		got := m.(*Abort).Text
		if len(got) > AbortTextBytesMax || len(got) < AbortTextBytesMax-utf8.UTFMax || !utf8.ValidString(got) || !strings.HasPrefix(text, got) {
			t.Fatalf("pad %d: cut to %d bytes, valid %v", pad, len(got), utf8.ValidString(got))
		}
	}
}

func TestEnumStrings(t *testing.T) {
	for _, s := range []string{
		MsgType(0).String(), MsgBlock.String(), MsgType(200).String(), MsgReply.String(), MsgRepairEnd.String(), MsgHandoffAck.String(), MsgBeatAsk.String(), MsgFeedAck.String(), MsgFenced.String(), MsgJoin.String(), MsgJoined.String(),
		HelloKind(0).String(), HelloFeed.String(), HelloRepair.String(), HelloReach.String(),
		BlockKind(0).String(), BlockUpserts.String(),
		CodecS2.String(), Codec(9).String(),
		AbortStaleEpoch.String(), AbortReason(math.MaxUint8).String(),
	} {
		if s == "" {
			t.Fatal("empty enum name")
		}
	}
	if AbortReason(200).Valid() || !AbortInternal.Valid() || MsgType(23).Valid() || !MsgJoined.Valid() || MsgJoined.Rejoin() || !MsgFenced.Valid() || MsgFenced.Rejoin() || !MsgFeedAck.Valid() || MsgFeedAck.Rejoin() || !MsgBeatAsk.Valid() || MsgBeatAsk.Rejoin() || !MsgHold.Valid() || !MsgHold.Rejoin() || !MsgHandoffAck.Valid() || !MsgHandoffAck.Rejoin() || MsgHello.Rejoin() || !MsgHeartbeat.Rejoin() || Codec(3).Valid() {
		t.Fatal("Valid disagrees with the enums")
	}
}
