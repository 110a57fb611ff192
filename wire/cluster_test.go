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

	"github.com/rejoin-db/rejoin/txnid"
)

func TestClusterRoundTrip(t *testing.T) {
	for i, m := range sampleClusterMessages(t) {
		t.Run(m.Type().String(), func(t *testing.T) {
			b := AppendMessage(nil, m)
			got, err := DecodeMessage(m.Type(), b)
			if err != nil {
				t.Fatalf("decode %d: %v", i, err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("got %+v, want %+v", got, m)
			}
			if again := AppendMessage(nil, got); !bytes.Equal(again, b) {
				t.Fatalf("re-encoding differs:\n%x\n%x", again, b)
			}
			if got.Header() != (MsgHeader{}) || m.Type().Rejoin() || !m.Type().Valid() {
				t.Fatalf("cluster message with header %+v, rejoin %v", got.Header(), m.Type().Rejoin())
			}
			var generic []any
			if err := msgpack.Unmarshal(b, &generic); err != nil {
				t.Fatalf("msgpack rejects our message: %v", err)
			}
			if n, _, _ := ReadArrayHeader(b); len(generic) != n {
				t.Fatalf("msgpack sees %d fields, want %d", len(generic), n)
			}
		})
	}
}

// Params and Out alias the payload, with their capacity ending with them;
// empty ones decode as nil.
func TestClusterAliasing(t *testing.T) {
	m := sampleClusterMessages(t)[1].(*Txn)
	b := AppendMessage(nil, m)
	got, err := DecodeMessage(MsgTxn, b)
	if err != nil {
		t.Fatal(err)
	}
	p := got.(*Txn).Params
	if &p[len(p)-1] != &b[len(b)-1] || cap(p) != len(p) {
		t.Fatal("Params does not alias the payload's end")
	}
	got, err = DecodeMessage(MsgDone, AppendMessage(nil, &Done{Out: []byte{}}))
	if err != nil || got.(*Done).Out != nil {
		t.Fatalf("empty Out decodes as %#v, %v", got, err)
	}
	got, err = DecodeMessage(MsgReply, AppendMessage(nil, &Reply{Each: []ReplicaOut{}}))
	if err != nil || got.(*Reply).Each != nil {
		t.Fatalf("empty Each decodes as %#v, %v", got, err)
	}
}

func TestClusterDecodeErrors(t *testing.T) {
	hello := AppendMessage(nil, &Hello{Kind: HelloFeed, Node: "n1", Initiator: 1}) // 99 02 a2 6e 31 01 00 00 90 c2 00 00
	if !bytes.Equal(hello, []byte{0x99, 2, 0xa2, 'n', '1', 1, 0, 0, 0x90, 0xc2, 0, 0}) {
		t.Fatalf("hello is %x", hello)
	}
	call := AppendMessage(nil, &Call{Req: 1, Partition: 2, Proc: "p", Params: []byte{0x90}}) // 95 01 02 a1 70 c4 01 90 c2
	if !bytes.Equal(call, []byte{0x95, 1, 2, 0xa1, 'p', 0xc4, 1, 0x90, 0xc2}) {
		t.Fatalf("call is %x", call)
	}
	repair := AppendMessage(nil, &Repair{Partition: 3, Initiator: 1, After: 5, Incarnation: 7}) // 94 03 01 05 07
	if !bytes.Equal(repair, []byte{0x94, 3, 1, 5, 7}) {
		t.Fatalf("repair is %x", repair)
	}
	repairEnd := AppendMessage(nil, &RepairEnd{Partition: 3, Initiator: 1, Last: 5, Err: "x"}) // 94 03 01 05 a1 78
	if !bytes.Equal(repairEnd, []byte{0x94, 3, 1, 5, 0xa1, 'x'}) {
		t.Fatalf("repair end is %x", repairEnd)
	}
	reply := func(each ...byte) []byte { return append([]byte{0x97, 1, 2, 0xc4, 0, 0xa0}, each...) }
	long := func(n int) []byte {
		return append([]byte{0xd9, byte(n)}, strings.Repeat("x", n)...)
	}
	tests := []struct {
		name    string
		t       MsgType
		payload []byte
		want    error
	}{
		{"hello too few fields", MsgHello, []byte{0x95, 2, 0xa0, 1, 0, 0}, ErrMalformed},
		{"hello too many fields", MsgHello, append([]byte{0x9a}, append(hello[1:], 0)...), ErrMalformed},
		{"hello missed not increasing", MsgHello, []byte{0x99, 2, 0xa2, 'n', '1', 1, 0, 0, 0x92, 3, 3}, ErrMalformed},
		{"hello missed partition over uint32", MsgHello, []byte{0x99, 2, 0xa2, 'n', '1', 1, 0, 0, 0x91, 0xcf, 1, 0, 0, 0, 0, 0, 0, 0}, ErrMalformed},
		{"hello missed not an array", MsgHello, []byte{0x99, 2, 0xa2, 'n', '1', 1, 0, 0, 0}, ErrMalformed},
		{"hello kind 0", MsgHello, patch(hello, 1, 0), ErrMalformed},
		{"hello kind 6", MsgHello, patch(hello, 1, 6), ErrMalformed},
		{"hello initiator over uint16", MsgHello, []byte{0x99, 2, 0xa0, 0xce, 0, 1, 0, 0, 0, 0, 0x90}, ErrMalformed},
		{"hello node too long", MsgHello, append(append([]byte{0x99, 2}, long(NodeBytesMax+1)...), 1, 0, 0, 0x90), ErrTooLarge},
		{"hello node str8 of 2", MsgHello, []byte{0x99, 2, 0xd9, 2, 'n', '1', 1, 0, 0, 0x90}, ErrNonCanonical},
		{"hello node as bin", MsgHello, []byte{0x99, 2, 0xc4, 2, 'n', '1', 1, 0, 0, 0x90}, ErrMalformed},
		{"hello trailing", MsgHello, append(bytes.Clone(hello), 0), ErrMalformed},
		{"txn proc too long", MsgTxn, append(append([]byte{0x94, 1, 2}, long(ProcBytesMax+1)...), 0xc4, 0), ErrTooLarge},
		{"txn params as str", MsgTxn, []byte{0x94, 1, 2, 0xa1, 'p', 0xa1, 0x90}, ErrMalformed},
		{"txn params bin16 of 1", MsgTxn, []byte{0x94, 1, 2, 0xa1, 'p', 0xc5, 0, 1, 0x90}, ErrNonCanonical},
		{"txn params past end", MsgTxn, []byte{0x94, 1, 2, 0xa1, 'p', 0xc4, 5, 0x90}, ErrTruncated},
		{"txn params too long", MsgTxn, []byte{0x94, 1, 2, 0xa1, 'p', 0xc6, 0x00, 0x40, 0x00, 0x01}, ErrTruncated},
		{"beat signed id", MsgBeat, []byte{0x91, 0xd0, 0x80}, ErrMalformed},
		{"done err too long", MsgDone, append([]byte{0x94, 1, 2, 0xc4, 0, 0xda, 0x02, 0x01}, strings.Repeat("x", ErrTextBytesMax+1)...), ErrTooLarge},
		{"call each nil", MsgCall, patch(call, len(call)-1, 0xc0), ErrMalformed},
		{"call each int", MsgCall, patch(call, len(call)-1, 0x01), ErrMalformed},
		{"call each missing", MsgCall, call[:len(call)-1], ErrTruncated},
		{"reply each not an array", MsgReply, reply(0xc0), ErrMalformed},
		{"reply each over limit", MsgReply, reply(0xdc, 0, ReplicaOutsMax+1), ErrTooLarge},
		{"reply each count over content", MsgReply, reply(0x92, 0x93, 0xa0, 0xc4, 0, 0xa0), ErrTruncated},
		{"reply each huge", MsgReply, reply(0xdd, 0xff, 0xff, 0xff, 0xff), ErrTruncated},
		{"reply each entry of 2 fields", MsgReply, reply(0x91, 0x92, 0xa0, 0xc4, 0), ErrMalformed},
		{"reply each entry node too long", MsgReply, append(append(reply(0x91, 0x93), long(NodeBytesMax+1)...), 0xc4, 0, 0xa0), ErrTooLarge},
		{"reply trailing", MsgReply, reply(0x90, 0xc2, 0, 0x90), ErrMalformed},
		{"reply uncertain missing", MsgReply, reply(0x90), ErrTruncated},
		{"reply refused missing", MsgReply, reply(0x90, 0xc2), ErrTruncated},
		{"reply refused over a byte", MsgReply, reply(0x90, 0xc2, 0xcd, 0x01, 0x00), ErrMalformed},
		{"reply of the 6 fields before refused", MsgReply, append([]byte{0x96, 1, 2, 0xc4, 0, 0xa0}, 0x90, 0xc2), ErrMalformed},
		{"reply uncertain int", MsgReply, reply(0x90, 0x01), ErrMalformed},
		{"reply of 5 fields", MsgReply, append([]byte{0x95, 1, 2, 0xc4, 0, 0xa0}, 0x90), ErrMalformed},
		{"repair too few fields", MsgRepair, []byte{0x93, 3, 1, 5}, ErrMalformed},
		{"repair too many fields", MsgRepair, []byte{0x95, 3, 1, 5, 7, 0}, ErrMalformed},
		{"repair trailing", MsgRepair, append(bytes.Clone(repair), 0), ErrMalformed},
		{"repair incarnation missing", MsgRepair, repair[:len(repair)-1], ErrTruncated},
		{"repair after missing", MsgRepair, repair[:len(repair)-2], ErrTruncated},
		{"repair initiator over uint16", MsgRepair, []byte{0x94, 3, 0xce, 0, 1, 0, 0, 5, 7}, ErrMalformed},
		{"repair partition over uint32", MsgRepair, []byte{0x94, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0, 1, 5, 7}, ErrMalformed},
		{"repair after signed", MsgRepair, []byte{0x94, 3, 1, 0xd0, 0x80, 7}, ErrMalformed},
		{"repair incarnation signed", MsgRepair, []byte{0x94, 3, 1, 5, 0xd0, 0x80}, ErrMalformed},
		{"repair initiator uint16 of 1", MsgRepair, []byte{0x94, 3, 0xcd, 0, 1, 5, 7}, ErrNonCanonical},
		{"repair end too few fields", MsgRepairEnd, []byte{0x93, 3, 1, 5}, ErrMalformed},
		{"repair end too many fields", MsgRepairEnd, []byte{0x95, 3, 1, 5, 0xa0, 0}, ErrMalformed},
		{"repair end trailing", MsgRepairEnd, append(bytes.Clone(repairEnd), 0), ErrMalformed},
		{"repair end err missing", MsgRepairEnd, repairEnd[:4], ErrTruncated},
		{"repair end err cut", MsgRepairEnd, repairEnd[:len(repairEnd)-1], ErrTruncated},
		{"repair end initiator over uint16", MsgRepairEnd, []byte{0x94, 3, 0xce, 0, 1, 0, 0, 5, 0xa0}, ErrMalformed},
		{"repair end err too long", MsgRepairEnd, append([]byte{0x94, 3, 1, 5, 0xda, 0x02, 0x01}, strings.Repeat("x", ErrTextBytesMax+1)...), ErrTooLarge},
		{"repair end err as bin", MsgRepairEnd, []byte{0x94, 3, 1, 5, 0xc4, 1, 'x'}, ErrMalformed},
		{"repair end err str8 of 1", MsgRepairEnd, []byte{0x94, 3, 1, 5, 0xd9, 1, 'x'}, ErrNonCanonical},
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

// AppendFrame refuses a cluster message DecodeMessage would refuse, and
// leaves dst alone; error texts are cut instead, so an error always goes.
func TestClusterLimits(t *testing.T) {
	big := make([]byte, ProcTupleBytesMax+1)
	name := strings.Repeat("x", ProcBytesMax+1)
	for _, m := range []Message{
		&Hello{Kind: HelloClient, Node: strings.Repeat("n", NodeBytesMax+1)},
		&Txn{Proc: name},
		&Txn{Proc: "p", Params: big},
		&Done{Out: big},
		&Call{Proc: name},
		&Call{Proc: "p", Params: big},
		&Reply{Out: big},
		&Reply{Each: make([]ReplicaOut, ReplicaOutsMax+1)},
		&Reply{Each: []ReplicaOut{{Node: strings.Repeat("n", NodeBytesMax+1)}}},
		&Reply{Each: []ReplicaOut{{Node: "n1", Out: big}}},
	} {
		dst := []byte("keep")
		got, err := AppendFrame(dst, m, CodecNone)
		if !errors.Is(err, ErrTooLarge) || !bytes.Equal(got, dst) {
			t.Errorf("%v: %v, %d bytes", m.Type(), err, len(got))
		}
	}
	// A Handoff's initiators: too many, out of order, out of range.
	many := make([]txnid.Initiator, txnid.InitiatorsMax+1)
	for i := range many {
		many[i] = txnid.Initiator(i)
	}
	for _, tt := range []struct {
		ins  []txnid.Initiator
		want error
	}{
		{many, ErrTooLarge},
		{[]txnid.Initiator{2, 1}, ErrMalformed},
		{[]txnid.Initiator{3, 3}, ErrMalformed},
		{[]txnid.Initiator{txnid.InitiatorsMax}, ErrMalformed},
	} {
		dst := []byte("keep")
		got, err := AppendFrame(dst, &Handoff{Initiators: tt.ins}, CodecNone)
		if !errors.Is(err, tt.want) || !bytes.Equal(got, dst) {
			t.Errorf("Handoff with %d initiators: %v, %d bytes; want %v", len(tt.ins), err, len(got), tt.want)
		}
	}
	if _, err := AppendFrame(nil, &Handoff{Initiators: many[:txnid.InitiatorsMax]}, CodecNone); err != nil {
		t.Errorf("Handoff with every initiator: %v", err)
	}
	// At the limits, everything goes through.
	at := &Reply{
		Out:  make([]byte, ProcTupleBytesMax),
		Each: make([]ReplicaOut, ReplicaOutsMax),
	}
	for i := range at.Each {
		at.Each[i].Node = strings.Repeat("n", NodeBytesMax)
	}
	f, err := AppendFrame(nil, at, CodecNone)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := DecodeFrame(f)
	if err != nil || !reflect.DeepEqual(got, at) {
		t.Fatalf("reply at the limits: %v", err)
	}
	for _, m := range []Message{
		&Repair{Partition: math.MaxUint32, Initiator: math.MaxUint16, After: math.MaxUint64},
		&RepairEnd{Partition: math.MaxUint32, Initiator: math.MaxUint16, Last: math.MaxUint64, Err: strings.Repeat("e", ErrTextBytesMax)},
	} {
		f, err := AppendFrame(nil, m, CodecNone)
		if err != nil {
			t.Fatal(err)
		}
		if got, _, err := DecodeFrame(f); err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("%v at the limits: %v, %v", m.Type(), got, err)
		}
	}

	text := strings.Repeat("é€😀", ErrTextBytesMax)
	for _, m := range []Message{
		&Done{Err: text},
		&Reply{Err: text},
		&Reply{Each: []ReplicaOut{{Node: "n1", Err: text}}},
		&RepairEnd{Err: text},
	} {
		f, err := AppendFrame(nil, m, CodecS2)
		if err != nil {
			t.Fatalf("%v with a long error: %v", m.Type(), err)
		}
		got, _, err := DecodeFrame(f)
		if err != nil {
			t.Fatal(err)
		}
		var e string
		switch got := got.(type) {
		case *Done:
			e = got.Err
		case *Reply:
			e = got.Err
			if len(got.Each) > 0 {
				e = got.Each[0].Err
			}
		case *RepairEnd:
			e = got.Err
		}
		if len(e) > ErrTextBytesMax || len(e) < ErrTextBytesMax-utf8.UTFMax || !utf8.ValidString(e) || !strings.HasPrefix(text, e) {
			t.Fatalf("%v error cut to %d bytes", m.Type(), len(e))
		}
	}
}

func TestErrText(t *testing.T) {
	if ErrText(nil) != "" {
		t.Fatal("nil error has text")
	}
	if ErrText(errors.New("")) == "" {
		t.Fatal("an error with empty text reads as success")
	}
	if s := ErrText(errors.New("boom")); s != "boom" {
		t.Fatalf("short text %q", s)
	}
	long := strings.Repeat("€", ErrTextBytesMax)
	if s := ErrText(errors.New(long)); len(s) > ErrTextBytesMax || !utf8.ValidString(s) || !strings.HasPrefix(long, s) {
		t.Fatalf("long text cut to %d bytes", len(s))
	}
}

func TestHelloKind(t *testing.T) {
	for k := range HelloKind(255) {
		if k.Valid() != (k == HelloClient || k == HelloFeed || k == HelloRejoin || k == HelloRepair || k == HelloReach) || k.String() == "" {
			t.Fatalf("kind %d: valid %v, %q", k, k.Valid(), k)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a Hello of kind 0")
		}
	}()
	AppendMessage(nil, &Hello{})
}

// TestHelloFrameBytesMax: the largest Hello there can be fits in
// HelloFrameBytesMax, uncompressed.
func TestHelloFrameBytesMax(t *testing.T) {
	h := &Hello{Kind: HelloFeed, Node: strings.Repeat("n", NodeBytesMax), Initiator: 1<<16 - 1,
		Partition: 1<<32 - 1, Epoch: 1<<64 - 1, Resume: true, Kept: 1<<64 - 1, To: 1<<64 - 1}
	for i := range MissedMax {
		h.Missed = append(h.Missed, 1<<32-MissedMax+uint32(i))
	}
	frame, err := AppendFrame(nil, h, CodecNone)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(frame) - FrameHeaderBytes; n > HelloFrameBytesMax {
		t.Fatalf("the largest Hello is %d bytes, HelloFrameBytesMax %d", n, HelloFrameBytesMax)
	}
}
