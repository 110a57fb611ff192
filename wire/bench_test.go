package wire

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// benchBlockBytes is the tuple budget of one benchmark block.
const benchBlockBytes = 256 << 10

var benchTypes = []Type{TypeBytes, TypeBytes}

// benchBlock is one block's worth of rows of a 16-byte key and a 100-byte
// value, as values and as stored tuples.
type benchBlock struct {
	vals       [][]Value
	stored     [][]byte
	tupleBytes int // the tuples alone, as the block budget counts them
}

// newBenchBlock makes rows from a fixed seed. The key is the row number
// (8 bytes big-endian) and 8 random bytes. The value is 64 bytes of one of
// 16 fixed 16-byte patterns repeated four times, then 36 random bytes: a
// table of short repeated strings with a random tail, neither the best nor
// the worst case. Frames come out at 45% of the tuple bytes with S2 and
// 40% with zstd (the frame/raw metric).
func newBenchBlock() *benchBlock {
	rng := rand.New(rand.NewPCG(42, 1))
	var patterns [16][16]byte
	for i := range patterns {
		for j := range patterns[i] {
			patterns[i][j] = byte('a' + rng.IntN(26))
		}
	}
	bb := &benchBlock{}
	var e TupleEncoder
	for i := 0; ; i++ {
		key := make([]byte, 16)
		binary.BigEndian.PutUint64(key, uint64(i))
		binary.BigEndian.PutUint64(key[8:], rng.Uint64())
		val := make([]byte, 100)
		p := patterns[rng.IntN(len(patterns))]
		for j := 0; j < 64; j += 16 {
			copy(val[j:], p[:])
		}
		for j := 64; j < len(val); j++ {
			val[j] = byte(rng.Uint32())
		}
		row := []Value{Bytes(key), Bytes(val)}
		tup, err := e.AppendTuple(nil, row)
		if err != nil {
			panic(err)
		}
		if bb.tupleBytes+len(tup) > benchBlockBytes {
			return bb
		}
		bb.vals = append(bb.vals, row)
		bb.stored = append(bb.stored, tup)
		bb.tupleBytes += len(tup)
	}
}

var benchHeader = MsgHeader{Epoch: 7, Partition: 3}

func BenchmarkBlockEncode(b *testing.B) {
	bb := newBenchBlock()
	for _, src := range []string{"values", "stored"} {
		for _, c := range allCodecs {
			b.Run("src="+src+"/codec="+c.String(), func(b *testing.B) {
				var w BlockWriter
				var frameBytes int
				b.SetBytes(int64(bb.tupleBytes))
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					w.Reset(benchHeader, BlockSnapshot, 1, uint64(i)+1)
					if src == "values" {
						for _, row := range bb.vals {
							if err := w.AppendTuple(row); err != nil {
								b.Fatal(err)
							}
						}
					} else {
						for _, tup := range bb.stored {
							w.AppendStored(tup)
						}
					}
					f, err := w.Frame(c)
					if err != nil {
						b.Fatal(err)
					}
					frameBytes = len(f)
				}
				b.ReportMetric(float64(frameBytes)/float64(bb.tupleBytes), "frame/raw")
			})
		}
	}
}

func BenchmarkBlockDecode(b *testing.B) {
	bb := newBenchBlock()
	for _, c := range allCodecs {
		b.Run("codec="+c.String(), func(b *testing.B) {
			var w BlockWriter
			w.Reset(benchHeader, BlockSnapshot, 1, 1)
			for _, tup := range bb.stored {
				w.AppendStored(tup)
			}
			f, err := w.Frame(c)
			if err != nil {
				b.Fatal(err)
			}
			var d FrameDecoder
			b.SetBytes(int64(bb.tupleBytes))
			b.ReportAllocs()
			for b.Loop() {
				m, _, err := d.DecodeFrame(f)
				if err != nil {
					b.Fatal(err)
				}
				blk := m.(*Block)
				_, pos, _ := ReadArrayHeader(blk.Tuples)
				for range blk.Count {
					n, err := ScanTuple(blk.Tuples[pos:], benchTypes, nil)
					if err != nil {
						b.Fatal(err)
					}
					pos += n
				}
				if pos != len(blk.Tuples) || int(blk.Count) != len(bb.stored) {
					b.Fatalf("scanned %d of %d bytes", pos, len(blk.Tuples))
				}
			}
		})
	}
}
