package partition

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/wire"
)

// The benchmark rows: a 16-byte bytes key and a 100-byte bytes value, 116
// raw bytes (121 as a stored tuple: array header, two bin headers).
const (
	benchKeyBytes   = 16
	benchValueBytes = 100
	// benchValues distinct values are cycled through; the store copies them
	// anyway, and this keeps pre-generated data to the keys.
	benchValues = 1 << 16
)

var benchRowCounts = []struct {
	name string
	n    int
}{{"1e6", 1e6}, {"5e6", 5e6}}

// benchData holds the keys (back to back) and values of n rows, generated
// from a fixed seed.
type benchData struct {
	n      int
	keys   []byte
	values []byte
}

var benchCache *benchData

func benchRows(n int) *benchData {
	if benchCache != nil && benchCache.n >= n {
		return benchCache
	}
	benchCache = nil
	rng := rand.New(rand.NewPCG(42, 42))
	d := &benchData{n: n, keys: make([]byte, n*benchKeyBytes), values: make([]byte, benchValues*benchValueBytes)}
	for i := range n {
		// Unique keys: a random half and the row number.
		k := d.keys[i*benchKeyBytes:]
		binary.LittleEndian.PutUint64(k, rng.Uint64())
		binary.BigEndian.PutUint64(k[8:], uint64(i))
	}
	for i := 0; i < len(d.values); i += 8 {
		binary.LittleEndian.PutUint64(d.values[i:], rng.Uint64())
	}
	benchCache = d
	return d
}

func (d *benchData) key(i int) []byte {
	return d.keys[i*benchKeyBytes : (i+1)*benchKeyBytes : (i+1)*benchKeyBytes]
}

func (d *benchData) value(i int) []byte {
	j := i % benchValues * benchValueBytes
	return d.values[j : j+benchValueBytes : j+benchValueBytes]
}

// heapAlloc returns the live heap after a full collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// gcTime times one full collection with whatever is live.
func gcTime() time.Duration {
	start := time.Now()
	runtime.GC()
	return time.Since(start)
}

// runInsertBench runs b.N iterations, each inserting n rows into a fresh
// store made by fill, and reports rows/s, the heap the store holds per
// row (after a collection), and the time of one collection with the store
// loaded.
func runInsertBench(b *testing.B, n int, fill func(d *benchData) (keep any)) {
	d := benchRows(n)
	var heap, gc float64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		before := heapAlloc()
		b.StartTimer()
		keep := fill(d)
		b.StopTimer()
		heap += float64(heapAlloc() - before)
		gc += float64(gcTime())
		runtime.KeepAlive(keep)
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(heap/float64(b.N)/float64(n), "heapB/row")
	b.ReportMetric(gc/float64(b.N)/1e6, "gc-ms")
}

// BenchmarkPartitionInsert inserts rows of a 16-byte key and a 100-byte
// value into a fresh table through Table.Insert, the path a procedure
// takes. The aim: at least as fast as BenchmarkMapInsert, and at most 1.5
// times the 116 raw bytes per row (174 heapB/row), arena, slot table and
// index included.
func BenchmarkPartitionInsert(b *testing.B) {
	schema := Schema{
		Name:    "bench",
		Columns: []Column{{"k", wire.TypeBytes}, {"v", wire.TypeBytes}},
		Key:     []int{0},
	}
	for _, rc := range benchRowCounts {
		b.Run("rows="+rc.name, func(b *testing.B) {
			runInsertBench(b, rc.n, func(d *benchData) any {
				p := New()
				tab, err := p.CreateTable(schema)
				if err != nil {
					b.Fatal(err)
				}
				row := make([]wire.Value, 2)
				for i := range rc.n {
					row[0] = wire.Bytes(d.key(i))
					row[1] = wire.Bytes(d.value(i))
					if _, err := tab.Insert(row); err != nil {
						b.Fatal(err)
					}
				}
				if tab.Len() != rc.n {
					b.Fatalf("table has %d rows", tab.Len())
				}
				return p
			})
		})
	}
}

// BenchmarkMapInsert is the yardstick: the same rows into a plain
// map[string][]byte that owns copies of its keys and values, as a store
// must.
func BenchmarkMapInsert(b *testing.B) {
	for _, rc := range benchRowCounts {
		b.Run("rows="+rc.name, func(b *testing.B) {
			runInsertBench(b, rc.n, func(d *benchData) any {
				m := make(map[string][]byte)
				for i := range rc.n {
					m[string(d.key(i))] = bytes.Clone(d.value(i))
				}
				if len(m) != rc.n {
					b.Fatalf("map has %d rows", len(m))
				}
				return m
			})
		})
	}
}

// BenchmarkPartitionLookup reads random rows back by key, for scale.
func BenchmarkPartitionLookup(b *testing.B) {
	const n = 1_000_000
	d := benchRows(n)
	p := New()
	tab, _ := p.CreateTable(Schema{Name: "bench", Columns: []Column{{"k", wire.TypeBytes}, {"v", wire.TypeBytes}}, Key: []int{0}})
	row := make([]wire.Value, 2)
	for i := range n {
		row[0], row[1] = wire.Bytes(d.key(i)), wire.Bytes(d.value(i))
		if _, err := tab.Insert(row); err != nil {
			b.Fatal(err)
		}
	}
	key := make([]wire.Value, 1)
	rng := rand.New(rand.NewPCG(1, 2))
	b.ResetTimer()
	for range b.N {
		key[0] = wire.Bytes(d.key(rng.IntN(n)))
		if _, ok := tab.LookupValues(key); !ok {
			b.Fatal(fmt.Sprint("missing key ", key[0]))
		}
	}
}

// BenchmarkPartitionUpsertTuples applies a snapshot of rows of a 16-byte
// key and a 100-byte value to a fresh table in runs of 256 KiB through
// Table.UpsertTuples, as a rejoin destination applies its blocks: with
// reserve=on the table is first sized for the rows (Table.Reserve, as the
// destination does for the source's count), with reserve=off its index
// doubles its way up. The runs are encoded before the timer starts.
func BenchmarkPartitionUpsertTuples(b *testing.B) {
	schema := Schema{
		Name:    "bench",
		Columns: []Column{{"k", wire.TypeBytes}, {"v", wire.TypeBytes}},
		Key:     []int{0},
	}
	const runBytesMax = 256 << 10
	for _, rc := range benchRowCounts[:1] {
		d := benchRows(rc.n)
		type run struct {
			tuples []byte
			count  int
		}
		var runs []run
		enc := wire.NewTupleEncoder()
		row := make([]wire.Value, 2)
		var cur run
		for i := range rc.n {
			row[0], row[1] = wire.Bytes(d.key(i)), wire.Bytes(d.value(i))
			var err error
			if cur.tuples, err = enc.AppendTuple(cur.tuples, row); err != nil {
				b.Fatal(err)
			}
			cur.count++
			if len(cur.tuples) >= runBytesMax || i == rc.n-1 {
				runs = append(runs, cur)
				cur = run{}
			}
		}
		for _, reserve := range []bool{false, true} {
			b.Run(fmt.Sprintf("rows=%s/reserve=%s", rc.name, map[bool]string{false: "off", true: "on"}[reserve]), func(b *testing.B) {
				runInsertBench(b, rc.n, func(*benchData) any {
					p := New()
					tab, err := p.CreateTable(schema)
					if err != nil {
						b.Fatal(err)
					}
					if reserve {
						tab.Reserve(rc.n)
					}
					for _, r := range runs {
						if err := tab.UpsertTuples(r.tuples, r.count); err != nil {
							b.Fatal(err)
						}
					}
					if tab.Len() != rc.n {
						b.Fatalf("table has %d rows", tab.Len())
					}
					return p
				})
			})
		}
	}
}
