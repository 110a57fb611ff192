package wire

import (
	"math"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/txnid"
)

// TestMain checks that nothing in wire, the shared zstd coders included,
// leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
	os.Exit(0) // not reached: VerifyTestMain exits
}

var sampleTypes = []Type{TypeInt64, TypeFloat64, TypeString, TypeBytes}

// sampleTuples returns the tuple payload of a block of n rows of
// sampleTypes, with values that exercise several int and length forms.
func sampleTuples(t testing.TB, n int) []byte {
	var e TupleEncoder
	b := AppendArrayHeader(nil, n)
	for i := range n {
		var err error
		b, err = e.AppendTuple(b, []Value{
			Int64(int64(i*i*37) - 1000),
			Float64(float64(i) / 7),
			String("row-" + string(rune('a'+i%26))),
			Bytes([]byte{byte(i), byte(i >> 8), 0xff, 0x00, 0xc1}),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// sampleMessages returns one message of each type, with fixed contents the
// golden files pin.
func sampleMessages(t testing.TB) []Message {
	h := MsgHeader{Epoch: 42, Partition: 300}
	return []Message{
		&Propose{MsgHeader: h, TxnID: txnid.ID(0x0123456789abcdef)},
		&Answer{MsgHeader: h, TxnID: txnid.ID(0x0123456789abcdf0)},
		&Block{MsgHeader: h, Kind: BlockSnapshot, Table: 2, Seq: 17, Count: 3, Tuples: sampleTuples(t, 3)},
		&Ack{MsgHeader: h, Seq: 17},
		&Handoff{MsgHeader: h, TxnID: txnid.ID(0x0123456789abd000), Digest: 0xfeedfacecafebeef, LastSeq: 99, Rows: 123456},
		&Abort{MsgHeader: h, Reason: AbortDigestMismatch, Text: "digest 1 != 2"},
		&Heartbeat{MsgHeader: MsgHeader{Epoch: math.MaxUint64, Partition: math.MaxUint32}, Tick: 0},
	}
}

// compressibleBlock returns a Block big enough to be worth compressing.
func compressibleBlock(t testing.TB) *Block {
	const n = 40
	return &Block{
		MsgHeader: MsgHeader{Epoch: 3, Partition: 1},
		Kind:      BlockUpserts, Table: 9, Seq: 5, Count: n,
		Tuples: sampleTuples(t, n),
	}
}
