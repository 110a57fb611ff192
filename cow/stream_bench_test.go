package cow

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// The benchmark table: a 16-byte bytes key and a 100-byte bytes value, a
// 121-byte stored tuple (as in partition's benchmarks), cut into blocks of
// 256 KiB.
const (
	benchKeyBytes   = 16
	benchValueBytes = 100
	benchBlockBytes = 256 << 10
)

func benchSchema() partition.Schema {
	return partition.Schema{
		Name:    "bench",
		Columns: []partition.Column{{Name: "k", Type: wire.TypeBytes}, {Name: "v", Type: wire.TypeBytes}},
		Key:     []int{0},
	}
}

// benchSource is the partition of n rows and its blocks, built once per
// process because loading a million rows takes longer than cutting them.
type benchSource struct {
	p          *partition.Partition
	rows       int
	tupleBytes int64
	blocks     []Block
}

var benchCache = map[int]*benchSource{}

func loadBenchSource(b *testing.B, n int) *benchSource {
	b.Helper()
	if bs := benchCache[n]; bs != nil {
		return bs
	}
	p := partition.New()
	tab, err := p.CreateTable(benchSchema())
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(42, 42))
	key := make([]byte, benchKeyBytes)
	val := make([]byte, benchValueBytes)
	row := []wire.Value{wire.Bytes(key), wire.Bytes(val)}
	for i := range n {
		binary.LittleEndian.PutUint64(key, rng.Uint64())
		binary.BigEndian.PutUint64(key[8:], uint64(i)) // unique
		for j := 0; j+8 <= len(val); j += 8 {
			binary.LittleEndian.PutUint64(val[j:], rng.Uint64())
		}
		binary.LittleEndian.PutUint32(val[len(val)-4:], rng.Uint32())
		if _, err := tab.Insert(row); err != nil {
			b.Fatal(err)
		}
	}
	bs := &benchSource{p: p, rows: n}
	// The blocks, kept for BenchmarkApply, and the tuple bytes.
	s, err := Activate(p, benchConfig())
	if err != nil {
		b.Fatal(err)
	}
	for {
		blk, ok := s.NextBlock(nil)
		if !ok {
			break
		}
		bs.blocks = append(bs.blocks, blk)
	}
	bs.tupleBytes = s.Metrics().Snapshot.Bytes
	s.Deactivate()
	benchCache[n] = bs
	return bs
}

func benchConfig() Config {
	cfg := DefaultConfig()
	cfg.BlockBytesMax = benchBlockBytes
	return cfg
}

// BenchmarkSnapshot cuts every snapshot block of a table, as the source
// does during the snapshot phase with no concurrent writes.
func BenchmarkSnapshot(b *testing.B) {
	b.Run("rows=1e6", func(b *testing.B) {
		bs := loadBenchSource(b, 1e6)
		buf := make([]byte, 0, 2*benchBlockBytes)
		b.SetBytes(bs.tupleBytes)
		b.ReportAllocs()
		b.ResetTimer()
		rows := 0
		for range b.N {
			s, err := Activate(bs.p, benchConfig())
			if err != nil {
				b.Fatal(err)
			}
			for {
				blk, ok := s.NextBlock(buf[:0])
				if !ok {
					break
				}
				rows += int(blk.Count)
				buf = blk.Tuples[:0]
			}
			s.Deactivate()
		}
		b.StopTimer()
		if rows != b.N*bs.rows {
			b.Fatalf("cut %d rows, want %d", rows, b.N*bs.rows)
		}
		b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
	})
}

// BenchmarkApply applies every snapshot block of a table to an empty
// destination partition, as a rejoining replica does.
func BenchmarkApply(b *testing.B) {
	b.Run("rows=1e6", func(b *testing.B) {
		bs := loadBenchSource(b, 1e6)
		b.SetBytes(bs.tupleBytes)
		b.ReportAllocs()
		b.ResetTimer()
		var a Applier
		for range b.N {
			b.StopTimer()
			dst := partition.New()
			if _, err := dst.CreateTable(benchSchema()); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			for _, blk := range bs.blocks {
				if err := a.Apply(dst, blk); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if dst.Digest() != bs.p.Digest() || dst.Table(1).Len() != bs.rows {
				b.Fatalf("destination has %d rows, digest %016x; source %d, %016x", dst.Table(1).Len(), dst.Digest(), bs.rows, bs.p.Digest())
			}
			b.StartTimer()
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N*bs.rows)/b.Elapsed().Seconds(), "rows/s")
	})
}
