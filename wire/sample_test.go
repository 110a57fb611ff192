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
		&Answer{MsgHeader: h, TxnID: txnid.ID(0x0123456789abcdf0), Rows: 1250000},
		&Block{MsgHeader: h, Kind: BlockSnapshot, Table: 2, Seq: 17, Count: 3, Tuples: sampleTuples(t, 3)},
		&Ack{MsgHeader: h, Seq: 17},
		&Handoff{MsgHeader: h, TxnID: txnid.ID(0x0123456789abd000), Digest: 0xfeedfacecafebeef, LastSeq: 99, Rows: 123456, Initiators: []txnid.Initiator{1, 2, 700}},
		&Abort{MsgHeader: h, Reason: AbortDigestMismatch, Text: "digest 1 != 2"},
		&Heartbeat{MsgHeader: MsgHeader{Epoch: math.MaxUint64, Partition: math.MaxUint32}, Tick: 0},
	}
}

// sampleClusterMessages returns one cluster message of each type (a Reply
// with and one without Each, a RepairEnd with and one without Err), with
// fixed contents the golden files pin. New ones go last, so the fuzz seeds
// named by index keep their names.
func sampleClusterMessages(t testing.TB) []Message {
	params := mustTuple(t, []Value{String("kv"), Bytes([]byte("key")), Bytes([]byte("value"))})
	out := mustTuple(t, []Value{Int64(-5), Int64(1 << 33)})
	return []Message{
		&Hello{Kind: HelloFeed, Node: "n12", Initiator: 12, Partition: 300, Epoch: 42, Missed: []uint32{0, 7, 65535}, Resume: true, Kept: txnid.ID(0x0123456789abcdf0), To: 1_700_000_000_123_456_789},
		&Txn{Partition: 3, ID: txnid.ID(0x0123456789abcdef), Proc: "upsert", Params: params},
		&Beat{ID: txnid.ID(0x0123456789abcdf0)},
		&Done{Partition: 3, ID: txnid.ID(0x0123456789abcdef), Err: "partition: unknown procedure: \"nope\""},
		&Call{Req: 1 << 40, Partition: math.MaxUint32, Proc: "digest", Params: []byte{0x90}, Each: true},
		&Reply{Req: 7, ID: txnid.ID(0x0123456789abd000), Out: out, Each: []ReplicaOut{
			{Node: "n1", Out: out},
			{Node: "n2", Err: "stopped"},
		}},
		&Reply{Req: 8, Err: "no replica of partition 3 is live"},
		&Reply{Req: 9, ID: txnid.ID(0x0123456789abd001), Err: "no live replica answered", Uncertain: true},
		&Repair{Partition: 3, Initiator: 12, After: txnid.ID(0x0123456789abcdef), Incarnation: 1_700_000_000_123_456_789},
		&RepairEnd{Partition: 3, Initiator: 12, Last: txnid.ID(0x0123456789abd000)},
		&RepairEnd{Partition: 3, Initiator: math.MaxUint16, Err: "feed from initiator 65535 is still open"},
	}
}

// allSampleMessages returns the rejoin and the cluster samples.
func allSampleMessages(t testing.TB) []Message {
	msgs := append(sampleMessages(t), sampleClusterMessages(t)...)
	msgs = append(msgs, lateRejoinMessages()...)
	return append(msgs, lateClusterMessages()...)
}

// lateClusterMessages are the cluster messages numbered after the late
// rejoin messages, in type order, with fixed contents the golden files
// pin. They go last, so the seeds named by index keep their names.
func lateClusterMessages() []Message {
	return []Message{
		&BeatAsk{ID: txnid.ID(0x0123456789abcdf1)},
		&FeedAck{ID: txnid.ID(0x0123456789abcdf2)},
		&Fenced{Partitions: []uint32{1, 9, 65535}},
		&Join{Partition: 4095},
		&Joined{Partition: 7, Floor: txnid.ID(0x0123456789abcdf2)},
		&Reply{Req: 10, Err: "the cluster is not bootstrapped yet", Refused: RefusedNotBootstrapped},
	}
}

// lateRejoinMessages are the rejoin messages numbered after the cluster
// messages, in type order, with fixed contents the golden files pin. They
// go last, so the seeds named by index keep their names.
func lateRejoinMessages() []Message {
	h := MsgHeader{Epoch: 42, Partition: 300}
	return []Message{
		&Hold{MsgHeader: h},
		&HandoffAck{MsgHeader: h, TxnID: txnid.ID(0x0123456789abd000), Digest: 0xfeedfacecafebeef},
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
