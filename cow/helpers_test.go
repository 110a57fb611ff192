package cow

import (
	"encoding/hex"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// The test tables: an int64 key with a bytes value; a 16-byte bytes key
// with a string value; and a two-column key (string, int64) that is not a
// prefix of the columns, so keys are built rather than sliced.
const (
	tabInts  = "ints"
	tabBlobs = "blobs"
	tabPairs = "pairs"
)

func testSchemas() []partition.Schema {
	return []partition.Schema{
		{Name: tabInts, Columns: []partition.Column{{Name: "id", Type: wire.TypeInt64}, {Name: "v", Type: wire.TypeBytes}}, Key: []int{0}},
		{Name: tabBlobs, Columns: []partition.Column{{Name: "k", Type: wire.TypeBytes}, {Name: "s", Type: wire.TypeString}}, Key: []int{0}},
		{Name: tabPairs, Columns: []partition.Column{
			{Name: "v", Type: wire.TypeBytes},
			{Name: "region", Type: wire.TypeString},
			{Name: "n", Type: wire.TypeInt64},
			{Name: "c", Type: wire.TypeInt64},
		}, Key: []int{1, 2}},
	}
}

// newTestPartition returns a partition with the test tables, empty.
func newTestPartition(t testing.TB) *partition.Partition {
	t.Helper()
	p := partition.New()
	for _, s := range testSchemas() {
		if _, err := p.CreateTable(s); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// intRow is a row of the ints table.
func intRow(id int64, v string) []wire.Value {
	return []wire.Value{wire.Int64(id), wire.Bytes([]byte(v))}
}

// intKey is the key tuple of the ints table's row id.
func intKey(id int64) []byte {
	b, err := wire.NewTupleEncoder().AppendTuple(nil, []wire.Value{wire.Int64(id)})
	if err != nil {
		panic(err)
	}
	return b
}

// blobKey is the 16-byte key number i of the blobs table.
func blobKey(i int) []byte {
	k := make([]byte, 16)
	copy(k, fmt.Sprintf("blob-key-%07d", i))
	return k
}

func blobRow(i int, s string) []wire.Value {
	return []wire.Value{wire.Bytes(blobKey(i)), wire.String(s)}
}

var regions = []string{"eu", "us", "ap"}

func pairRow(region string, n int64, v string, c int64) []wire.Value {
	return []wire.Value{wire.Bytes([]byte(v)), wire.String(region), wire.Int64(n), wire.Int64(c)}
}

// mustInsert inserts row into the table named name and returns its slot.
func mustInsert(t testing.TB, p *partition.Partition, name string, row []wire.Value) partition.Slot {
	t.Helper()
	s, err := p.TableByName(name).Insert(row)
	if err != nil {
		t.Fatalf("insert into %s: %v", name, err)
	}
	return s
}

// intSlot returns the slot of the ints row id, failing if there is none.
func intSlot(t testing.TB, p *partition.Partition, id int64) partition.Slot {
	t.Helper()
	s, ok := p.TableByName(tabInts).Lookup(intKey(id))
	if !ok {
		t.Fatalf("ints row %d not found", id)
	}
	return s
}

// intValue returns the value of the ints row id and whether it exists.
func intValue(t testing.TB, p *partition.Partition, id int64) (string, bool) {
	t.Helper()
	tab := p.TableByName(tabInts)
	s, ok := tab.Lookup(intKey(id))
	if !ok {
		return "", false
	}
	row, err := tab.Row(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return string(row[1].Bytes), true
}

// content lists every row of p, one "table: tuple-hex" line per row,
// sorted: equal strings mean equal row sets, whatever the slots.
func content(p *partition.Partition) string {
	var lines []string
	for _, tab := range p.Tables() {
		for s := partition.Slot(0); s < tab.SlotsLen(); s++ {
			if tu := tab.Tuple(s); tu != nil {
				lines = append(lines, tab.Schema().Name+": "+hex.EncodeToString(tu))
			}
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// requireSame fails unless dst holds exactly src's rows: the digests and
// the full row sets are compared, and the first difference is shown.
func requireSame(t testing.TB, src, dst *partition.Partition, what string) {
	t.Helper()
	sc, dc := content(src), content(dst)
	if sc == dc && src.Digest() == dst.Digest() {
		return
	}
	sl, dl := strings.Split(sc, "\n"), strings.Split(dc, "\n")
	var diff []string
	for _, l := range sl {
		if !slices.Contains(dl, l) {
			diff = append(diff, "missing at destination: "+l)
		}
	}
	for _, l := range dl {
		if !slices.Contains(sl, l) {
			diff = append(diff, "extra at destination:   "+l)
		}
	}
	for i, l := range diff {
		if len(l) > 120 {
			diff[i] = l[:120] + "..."
		}
	}
	if len(diff) > 10 {
		diff = append(diff[:10], fmt.Sprintf("... %d more", len(diff)-10))
	}
	t.Fatalf("%s: destination differs from source (digest %016x vs %016x, %d vs %d rows):\n%s",
		what, dst.Digest(), src.Digest(), len(dl), len(sl), strings.Join(diff, "\n"))
}

// shipper applies a stream's blocks to a destination and checks each
// block's shape on the way.
type shipper struct {
	t   testing.TB
	s   *Stream
	dst *partition.Partition
	a   Applier
	buf []byte
}

// next cuts and applies one block; false when the phase has none left.
func (sh *shipper) next() bool {
	// No t.Helper here or in verifyStream: they run for every block, and
	// Helper costs a stack walk; their messages say where they fail.
	b, ok := sh.s.NextBlock(sh.buf[:0])
	verifyStream(sh.t, sh.s)
	if !ok {
		return false
	}
	if b.Count == 0 {
		sh.t.Fatalf("empty %v block for table %d", b.Kind, b.Table)
	}
	if err := wire.ScanTuples(b.Tuples, int(b.Count)); err != nil {
		sh.t.Fatalf("%v block for table %d is malformed: %v", b.Kind, b.Table, err)
	}
	if tb := len(b.Tuples) - len(wire.AppendArrayHeader(nil, int(b.Count))); b.Count > 1 && tb > sh.s.cfg.BlockBytesMax {
		sh.t.Fatalf("%v block of %d tuples holds %d tuple bytes, BlockBytesMax %d", b.Kind, b.Count, tb, sh.s.cfg.BlockBytesMax)
	}
	if err := sh.a.Apply(sh.dst, b); err != nil {
		sh.t.Fatalf("apply %v block for table %d: %v", b.Kind, b.Table, err)
	}
	sh.buf = b.Tuples[:0]
	return true
}

// drain ships the rest of the current phase.
func (sh *shipper) drain() {
	sh.t.Helper()
	for sh.next() {
	}
}

// blocks ships up to n blocks of the current phase.
func (sh *shipper) blocks(n int) {
	sh.t.Helper()
	for range n {
		if !sh.next() {
			return
		}
	}
}

// round starts a round and ships it whole.
func (sh *shipper) round() {
	sh.t.Helper()
	if err := sh.s.StartRound(); err != nil {
		sh.t.Fatal(err)
	}
	sh.drain()
}

// finish ships whatever phase is in flight, then the final delta, and
// checks the stream ends Done with the destination equal to the source.
func (sh *shipper) finish(src *partition.Partition) {
	sh.t.Helper()
	sh.drain()
	if err := sh.s.FinalDelta(); err != nil {
		sh.t.Fatal(err)
	}
	sh.drain()
	if ph := sh.s.Phase(); ph != PhaseDone {
		sh.t.Fatalf("phase %v after the final delta, want done", ph)
	}
	if n := sh.s.LogBytes(); n != 0 {
		sh.t.Fatalf("log holds %d bytes after the final delta", n)
	}
	requireSame(sh.t, src, sh.dst, "after the final delta")
}

// verifyStream checks the stream's internal bookkeeping from scratch: the
// log byte counts, the dirty lists against their bitsets, and the round's
// position.
func verifyStream(t testing.TB, s *Stream) {
	if s.phase == PhaseInactive {
		if s.cur != nil || s.round != nil {
			t.Fatal("inactive stream still holds its logs")
		}
		return
	}
	check := func(name string, l *changeLog, shipping bool) {
		bytes := 0
		for i := range l.tables {
			tl := &l.tables[i]
			keysFrom, dirtyFrom := 0, 0
			if shipping {
				switch {
				case s.rKind == wire.BlockDeletes && i < s.rTable:
					keysFrom = len(tl.keyEnds)
				case s.rKind == wire.BlockDeletes && i == s.rTable:
					keysFrom = s.rNext
				case s.rKind == wire.BlockUpserts:
					keysFrom = len(tl.keyEnds)
					if i < s.rTable {
						dirtyFrom = len(tl.dirty)
					} else if i == s.rTable {
						dirtyFrom = s.rNext
					}
				}
			}
			prev := uint32(0)
			for k, end := range tl.keyEnds {
				if end < prev || int(end) > len(tl.keys) {
					t.Fatalf("%s log table %d: key %d ends at %d after %d (%d key bytes)", name, i+1, k, end, prev, len(tl.keys))
				}
				if k >= keysFrom {
					bytes += int(end-prev) + keyEntryOverheadBytes
				}
				prev = end
			}
			if int(prev) != len(tl.keys) {
				t.Fatalf("%s log table %d: keys end at %d of %d bytes", name, i+1, prev, len(tl.keys))
			}
			bytes += dirtyEntryBytes * (len(tl.dirty) - dirtyFrom)
			set := 0
			for _, w := range tl.member {
				set += bits.OnesCount64(w)
			}
			if set != len(tl.dirty)-dirtyFrom {
				t.Fatalf("%s log table %d: %d member bits for %d unshipped dirty slots", name, i+1, set, len(tl.dirty)-dirtyFrom)
			}
			seen := map[partition.Slot]bool{}
			for k, slot := range tl.dirty[dirtyFrom:] {
				if seen[slot] {
					t.Fatalf("%s log table %d: slot %d listed twice", name, i+1, slot)
				}
				seen[slot] = true
				if tl.member[slot>>6]&(1<<(slot&63)) == 0 {
					t.Fatalf("%s log table %d: dirty entry %d, slot %d, has no member bit", name, i+1, dirtyFrom+k, slot)
				}
			}
		}
		if bytes != l.bytes {
			t.Fatalf("%s log counts %d bytes, entries make %d", name, l.bytes, bytes)
		}
	}
	check("current", s.cur, false)
	inRound := s.phase == PhaseRound || s.phase == PhaseFinal
	if !inRound && s.round.bytes != 0 {
		t.Fatalf("phase %v with %d round bytes", s.phase, s.round.bytes)
	}
	check("round", s.round, inRound)
	if s.LogBytes() > s.m.LogBytesPeak {
		t.Fatalf("LogBytes %d above its peak %d", s.LogBytes(), s.m.LogBytesPeak)
	}
}

// testConfig is a config for small tests: one-row blocks unless changed,
// and a log too large to throttle anything.
func testConfig() Config {
	return Config{
		BlockBytesMax:        1,
		ChangeLogBytesMax:    1 << 20,
		ChangeLogTxnBytesMax: 1 << 10,
		PaceLowWaterBytes:    1 << 19,
		ThrottleWindowTicks:  4,
		PaceTxnsPerTick:      10,
	}
}

// activate starts a stream on src with cfg and a shipper to dst.
func activate(t testing.TB, src, dst *partition.Partition, cfg Config) (*Stream, *shipper) {
	t.Helper()
	s, err := Activate(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Deactivate)
	return s, &shipper{t: t, s: s, dst: dst}
}

// makeBlock builds a block of kind for table id from whole tuples.
func makeBlock(kind wire.BlockKind, id partition.TableID, tuples ...[]byte) Block {
	b := wire.AppendArrayHeader(nil, len(tuples))
	for _, tu := range tuples {
		b = append(b, tu...)
	}
	return Block{Kind: kind, Table: id, Count: uint32(len(tuples)), Tuples: b}
}

// deleteBlock builds a delete block for table id.
func deleteBlock(id partition.TableID, keys ...[]byte) Block {
	return makeBlock(wire.BlockDeletes, id, keys...)
}
