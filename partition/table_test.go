package partition

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

// kvSchema is a table whose key is its first column: the index reads keys
// in place.
func kvSchema() Schema {
	return Schema{
		Name:    "kv",
		Columns: []Column{{"k", wire.TypeInt64}, {"v", wire.TypeString}},
		Key:     []int{0},
	}
}

func kvRow(k int64, v string) []wire.Value { return []wire.Value{wire.Int64(k), wire.String(v)} }

// compSchema is a table with a two-column key that is not a prefix of the
// columns, in another order than the columns: the index builds keys.
func compSchema() Schema {
	return Schema{
		Name: "comp",
		Columns: []Column{
			{"payload", wire.TypeBytes},
			{"a", wire.TypeInt64},
			{"f", wire.TypeFloat64},
			{"b", wire.TypeString},
		},
		Key: []int{3, 1},
	}
}

func newTestTable(t testing.TB, s Schema) (*Partition, *Table) {
	t.Helper()
	p := New()
	tab, err := p.CreateTable(s)
	if err != nil {
		t.Fatal(err)
	}
	return p, tab
}

func mustVerify(t testing.TB, tab *Table) {
	t.Helper()
	if err := tab.verify(); err != nil {
		t.Fatalf("table %q: %v", tab.Schema().Name, err)
	}
}

func encode(t testing.TB, vals ...wire.Value) []byte {
	t.Helper()
	b, err := wire.NewTupleEncoder().AppendTuple(nil, vals)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// state is what a failed write must leave alone.
type state struct {
	digest, pdigest uint64
	n               int
	slots           Slot
	events          int
}

func stateOf(p *Partition, tab *Table, rec *recorder) state {
	return state{tab.Digest(), p.Digest(), tab.Len(), tab.SlotsLen(), len(rec.events)}
}

func TestTableErrors(t *testing.T) {
	p, tab := newTestTable(t, kvSchema())
	rec := &recorder{p: p}
	p.SetObserver(rec)
	s1, err := tab.Insert(kvRow(1, "one"))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := tab.Insert(kvRow(2, "two"))
	if err != nil {
		t.Fatal(err)
	}
	dead, err := tab.Insert(kvRow(3, "three"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tab.Delete(dead); err != nil {
		t.Fatal(err)
	}
	rec.take()
	good := encode(t, wire.Int64(9), wire.String("nine"))
	long := make([]byte, TupleBytesMax)

	for _, tc := range []struct {
		name string
		op   func() error
		want []error
	}{
		{"insert duplicate key", func() error { _, err := tab.Insert(kvRow(1, "other")); return err }, []error{ErrDuplicateKey}},
		{"insert tuple duplicate key", func() error {
			_, err := tab.InsertTuple(encode(t, wire.Int64(2), wire.String("x")))
			return err
		}, []error{ErrDuplicateKey}},
		{"update onto another row's key", func() error { return tab.Update(s1, kvRow(2, "x")) }, []error{ErrDuplicateKey}},
		{"update tuple onto another row's key", func() error {
			return tab.UpdateTuple(s2, encode(t, wire.Int64(1), wire.String("x")))
		}, []error{ErrDuplicateKey}},
		{"insert too few values", func() error { _, err := tab.Insert([]wire.Value{wire.Int64(5)}); return err }, []error{ErrSchema}},
		{"insert too many values", func() error {
			_, err := tab.Insert(append(kvRow(5, "x"), wire.Int64(0)))
			return err
		}, []error{ErrSchema}},
		{"insert wrong type", func() error {
			_, err := tab.Insert([]wire.Value{wire.String("5"), wire.String("x")})
			return err
		}, []error{ErrSchema}},
		{"insert invalid type", func() error { _, err := tab.Insert([]wire.Value{{}, wire.String("x")}); return err }, []error{ErrSchema}},
		{"update wrong arity", func() error { return tab.Update(s1, kvRow(1, "x")[:1]) }, []error{ErrSchema}},
		{"update wrong type", func() error {
			return tab.Update(s1, []wire.Value{wire.Int64(1), wire.Bytes([]byte("x"))})
		}, []error{ErrSchema}},
		{"insert tuple trailing bytes", func() error { _, err := tab.InsertTuple(append(good[:len(good):len(good)], 0)); return err }, []error{ErrSchema}},
		{"insert tuple truncated", func() error { _, err := tab.InsertTuple(good[:len(good)-1]); return err }, []error{ErrSchema, wire.ErrTruncated}},
		{"insert tuple wrong types", func() error {
			_, err := tab.InsertTuple(encode(t, wire.String("9"), wire.String("x")))
			return err
		}, []error{ErrSchema, wire.ErrMalformed}},
		{"insert tuple wrong arity", func() error { _, err := tab.InsertTuple(encode(t, wire.Int64(9))); return err }, []error{ErrSchema, wire.ErrMalformed}},
		{"insert tuple non-canonical int", func() error {
			// int64 9 as int8 0xd0 0x09 instead of fixint 0x09.
			_, err := tab.InsertTuple([]byte{0x92, 0xd0, 0x09, 0xa1, 'x'})
			return err
		}, []error{ErrSchema, wire.ErrNonCanonical}},
		{"insert tuple empty", func() error { _, err := tab.InsertTuple(nil); return err }, []error{ErrSchema}},
		{"insert tuple too large", func() error { _, err := tab.InsertTuple(append(long, 0)); return err }, []error{ErrTupleTooLarge}},
		{"update tuple trailing bytes", func() error { return tab.UpdateTuple(s1, append(encode(t, wire.Int64(1), wire.String("x")), 0x90)) }, []error{ErrSchema}},
		{"upsert trailing bytes", func() error { _, err := tab.Upsert(append(good[:len(good):len(good)], 1)); return err }, []error{ErrSchema}},
		{"update dead slot", func() error { return tab.Update(dead, kvRow(3, "x")) }, []error{ErrNoRow}},
		{"update slot never used", func() error { return tab.Update(1000, kvRow(3, "x")) }, []error{ErrNoRow}},
		{"update tuple dead slot", func() error { return tab.UpdateTuple(dead, good) }, []error{ErrNoRow}},
		{"delete dead slot", func() error { return tab.Delete(dead) }, []error{ErrNoRow}},
		{"delete slot never used", func() error { return tab.Delete(1 << 30) }, []error{ErrNoRow}},
		{"row of dead slot", func() error { _, err := tab.Row(dead, nil); return err }, []error{ErrNoRow}},
		{"delete malformed key", func() error { _, err := tab.DeleteKey([]byte{0x91}); return err }, []error{ErrSchema}},
		{"delete key of wrong type", func() error { _, err := tab.DeleteKey(encode(t, wire.String("1"))); return err }, []error{ErrSchema}},
		{"delete key with trailing bytes", func() error { _, err := tab.DeleteKey(append(encode(t, wire.Int64(1)), 0)); return err }, []error{ErrSchema}},
		{"insert at live slot", func() error { return tab.InsertTupleAt(s1, good) }, []error{ErrSlotNotFree}},
		{"insert at slot never used", func() error { return tab.InsertTupleAt(tab.SlotsLen(), good) }, []error{ErrSlotNotFree}},
		{"insert at free slot, duplicate key", func() error {
			return tab.InsertTupleAt(dead, encode(t, wire.Int64(1), wire.String("x")))
		}, []error{ErrDuplicateKey}},
		{"insert at free slot, bad tuple", func() error { return tab.InsertTupleAt(dead, good[:2]) }, []error{ErrSchema}},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			before := stateOf(p, tab, rec)
			err := tc.op()
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.HasPrefix(err.Error(), "partition: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("error %q is not %v", err, w)
				}
			}
			if after := stateOf(p, tab, rec); after != before {
				t.Errorf("failed write changed the table: %+v -> %+v", before, after)
			}
			if got, _ := tab.Row(s1, nil); !slices.EqualFunc(got, kvRow(1, "one"), wire.Value.Equal) {
				t.Errorf("row 1 is now %v", got)
			}
			mustVerify(t, tab)
		})
	}
	if _, ok := tab.Lookup([]byte{0x91}); ok {
		t.Error("Lookup of a malformed key found a row")
	}
	if _, ok := tab.Lookup(encode(t, wire.Int64(1), wire.Int64(1))); ok {
		t.Error("Lookup of a key with too many fields found a row")
	}
	if _, ok := tab.LookupValues([]wire.Value{wire.String("1")}); ok {
		t.Error("LookupValues with a wrong type found a row")
	}
	if _, ok := tab.LookupValues(nil); ok {
		t.Error("LookupValues with no values found a row")
	}
	if ok, err := tab.DeleteKey(encode(t, wire.Int64(77))); ok || err != nil {
		t.Errorf("DeleteKey of an absent key = %v, %v", ok, err)
	}
}

func TestTableBasics(t *testing.T) {
	for _, s := range []Schema{kvSchema(), compSchema()} {
		t.Run("schema="+s.Name, func(t *testing.T) {
			_, tab := newTestTable(t, s)
			row := func(i int, v string) []wire.Value {
				if s.Name == "kv" {
					return kvRow(int64(i), v)
				}
				return []wire.Value{wire.Bytes([]byte(v)), wire.Int64(int64(i)), wire.Float64(float64(i) / 2), wire.String(fmt.Sprint("b", i))}
			}
			key := func(r []wire.Value) []wire.Value {
				k := make([]wire.Value, len(s.Key))
				for i, c := range s.Key {
					k[i] = r[c]
				}
				return k
			}
			var slots []Slot
			for i := range 100 {
				sl, err := tab.Insert(row(i, strings.Repeat("x", i)))
				if err != nil {
					t.Fatal(err)
				}
				if sl != Slot(i) {
					t.Fatalf("insert %d got slot %d", i, sl)
				}
				slots = append(slots, sl)
			}
			for i, sl := range slots {
				r := row(i, strings.Repeat("x", i))
				got, err := tab.Row(sl, nil)
				if err != nil || !slices.EqualFunc(got, r, wire.Value.Equal) {
					t.Fatalf("Row(%d) = %v, %v; want %v", sl, got, err, r)
				}
				if ls, ok := tab.LookupValues(key(r)); !ok || ls != sl {
					t.Fatalf("LookupValues(%v) = %d, %v", key(r), ls, ok)
				}
				kb := encode(t, key(r)...)
				if ls, ok := tab.Lookup(kb); !ok || ls != sl {
					t.Fatalf("Lookup(%x) = %d, %v", kb, ls, ok)
				}
				if !bytes.Equal(tab.Tuple(sl), encode(t, r...)) {
					t.Fatalf("Tuple(%d) differs from the encoding", sl)
				}
			}
			// Free slots come back most recent first.
			for _, sl := range []Slot{10, 20, 30} {
				if err := tab.Delete(sl); err != nil {
					t.Fatal(err)
				}
			}
			for _, want := range []Slot{30, 20, 10, 100} {
				got, err := tab.Insert(row(1000+int(want), "again"))
				if err != nil || got != want {
					t.Fatalf("reinsert got slot %d, %v; want %d", got, err, want)
				}
			}
			if tab.Len() != 101 || tab.SlotsLen() != 101 {
				t.Fatalf("Len %d SlotsLen %d", tab.Len(), tab.SlotsLen())
			}
			mustVerify(t, tab)
		})
	}
}

func TestInsertTupleAtUndoesDelete(t *testing.T) {
	_, tab := newTestTable(t, kvSchema())
	for i := range 10 {
		if _, err := tab.Insert(kvRow(int64(i), fmt.Sprint("v", i))); err != nil {
			t.Fatal(err)
		}
	}
	d0 := tab.Digest()
	// A txn deletes 3 then 7 and inserts a row (which takes slot 7); the
	// rollback undoes in reverse: delete the insert, re-insert 7, then 3.
	old3 := bytes.Clone(tab.Tuple(3))
	old7 := bytes.Clone(tab.Tuple(7))
	_ = tab.Delete(3)
	_ = tab.Delete(7)
	s, _ := tab.Insert(kvRow(100, "new"))
	if s != 7 {
		t.Fatalf("insert took slot %d, want 7", s)
	}
	_ = tab.Delete(s)
	for _, u := range []struct {
		s Slot
		b []byte
	}{{7, old7}, {3, old3}} {
		if err := tab.InsertTupleAt(u.s, u.b); err != nil {
			t.Fatal(err)
		}
	}
	if tab.Digest() != d0 || tab.Len() != 10 || tab.SlotsLen() != 10 {
		t.Fatalf("after undo: digest %x (want %x), Len %d, SlotsLen %d", tab.Digest(), d0, tab.Len(), tab.SlotsLen())
	}
	mustVerify(t, tab)
	// A free slot that is not on top of the free list also works.
	for _, s := range []Slot{2, 5, 8} {
		_ = tab.Delete(s)
	}
	if err := tab.InsertTupleAt(5, encode(t, wire.Int64(5), wire.String("v5"))); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, tab)
	if s, _ := tab.Insert(kvRow(50, "x")); s != 8 {
		t.Fatalf("next insert took slot %d, want 8", s)
	}
	if s, _ := tab.Insert(kvRow(51, "x")); s != 2 {
		t.Fatalf("next insert took slot %d, want 2", s)
	}
	mustVerify(t, tab)
}

func TestAppendTuples(t *testing.T) {
	_, tab := newTestTable(t, kvSchema())
	if out, next, n := tab.AppendTuples(nil, 0, 100); len(out) != 0 || next != 0 || n != 0 {
		t.Fatalf("empty table: %x, %d, %d", out, next, n)
	}
	var want [][]byte
	for i := range 50 {
		s, _ := tab.Insert(kvRow(int64(i), strings.Repeat("y", i)))
		if i%3 == 0 {
			_ = tab.Delete(s)
			continue
		}
		want = append(want, bytes.Clone(tab.Tuple(s)))
	}
	for _, maxBytes := range []int{0, 1, 10, 64, 1000, 1 << 20} {
		var got [][]byte
		calls := 0
		for from := Slot(0); from < tab.SlotsLen(); calls++ {
			out, next, n := tab.AppendTuples([]byte("hdr"), from, maxBytes)
			if !bytes.HasPrefix(out, []byte("hdr")) || next <= from {
				t.Fatalf("maxBytes %d: AppendTuples from %d lost dst or did not advance (next %d)", maxBytes, from, next)
			}
			tuples := splitTuples(t, tab, out[3:])
			if len(tuples) != n || n == 0 {
				t.Fatalf("maxBytes %d: %d tuples reported, %d appended", maxBytes, n, len(tuples))
			}
			if n > 1 && len(out)-3 > maxBytes {
				t.Fatalf("maxBytes %d: appended %d bytes in %d tuples", maxBytes, len(out)-3, n)
			}
			got = append(got, tuples...)
			from = next
		}
		if !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("maxBytes %d: walk returned %d tuples, want %d", maxBytes, len(got), len(want))
		}
	}
	// From past the end: nothing, and the cursor does not move back.
	if out, next, n := tab.AppendTuples(nil, tab.SlotsLen()+5, 100); len(out) != 0 || next != tab.SlotsLen()+5 || n != 0 {
		t.Fatalf("past the end: %d bytes, next %d, %d tuples", len(out), next, n)
	}
}

// splitTuples cuts back-to-back stored tuples apart.
func splitTuples(t testing.TB, tab *Table, b []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for len(b) > 0 {
		n, err := wire.ScanTuple(b, tab.Schema().Types(), nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b[:n])
		b = b[n:]
	}
	return out
}

func TestClear(t *testing.T) {
	p, tab := newTestTable(t, kvSchema())
	other, err := p.CreateTable(compSchema())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{p: p}
	p.SetObserver(rec)
	for i := range 5000 {
		if _, err := tab.Insert(kvRow(int64(i), strings.Repeat("z", i%200))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Insert([]wire.Value{wire.Bytes(nil), wire.Int64(1), wire.Float64(0), wire.String("b")}); err != nil {
		t.Fatal(err)
	}
	rec.take()
	p.Clear()
	if len(rec.events) != 0 {
		t.Fatalf("Clear reported %d events", len(rec.events))
	}
	for _, x := range []*Table{tab, other} {
		if x.Len() != 0 || x.SlotsLen() != 0 || x.Digest() != 0 {
			t.Fatalf("after Clear: Len %d SlotsLen %d Digest %x", x.Len(), x.SlotsLen(), x.Digest())
		}
		mustVerify(t, x)
	}
	if p.Digest() != 0 {
		t.Fatalf("partition digest %x after Clear", p.Digest())
	}
	if _, ok := tab.LookupValues([]wire.Value{wire.Int64(7)}); ok {
		t.Fatal("a cleared row is still found")
	}
	if tab.arena.capBytes > ChunkBytesMin {
		t.Fatalf("cleared table still holds %d arena bytes", tab.arena.capBytes)
	}
	// Reusable: same rows, same slots, same digest as a fresh table.
	_, fresh := newTestTable(t, kvSchema())
	for i := range 100 {
		s, err := tab.Insert(kvRow(int64(i), "again"))
		if err != nil || s != Slot(i) {
			t.Fatalf("insert after Clear: slot %d, %v", s, err)
		}
		_, _ = fresh.Insert(kvRow(int64(i), "again"))
	}
	if tab.Digest() != fresh.Digest() {
		t.Fatalf("digest after Clear and refill %x, fresh table %x", tab.Digest(), fresh.Digest())
	}
	if got := len(rec.take()); got != 100 {
		t.Fatalf("observer saw %d events after Clear, want 100", got)
	}
	mustVerify(t, tab)
}

func TestSchemaIsCopied(t *testing.T) {
	s := kvSchema()
	_, tab := newTestTable(t, s)
	s.Columns[1].Type = wire.TypeBytes
	s.Key[0] = 1
	if got := tab.Schema(); got.Columns[1].Type != wire.TypeString || got.Key[0] != 0 {
		t.Fatalf("the caller's schema slices changed the table: %+v", got)
	}
}

// TestReserve: Reserve sizes the index once for the rows to come, so
// inserting up to that many never rehashes it again; it keeps the rows,
// their slots and the digest; it does nothing for a count at or below the
// table's size; and it caps a wrong or hostile count at ReserveRowsMax.
func TestReserve(t *testing.T) {
	p, tab := newTestTable(t, kvSchema())
	for i := range 10 {
		if _, err := tab.Insert(kvRow(int64(i), "before")); err != nil {
			t.Fatal(err)
		}
	}
	digest := tab.Digest()
	const rows = 100_000
	tab.Reserve(rows)
	// The smallest power of two that holds rows under the load bound.
	if got, want := len(tab.index.buckets), 1<<18; got != want {
		t.Fatalf("Reserve(%d): %d buckets, want %d", rows, got, want)
	}
	mustVerify(t, tab)
	if tab.Len() != 10 || tab.Digest() != digest {
		t.Fatalf("Reserve changed the content: %d rows, digest %x (was %x)", tab.Len(), tab.Digest(), digest)
	}
	for i := range 10 {
		if s, ok := tab.LookupValues([]wire.Value{wire.Int64(int64(i))}); !ok || s != Slot(i) {
			t.Fatalf("row %d after Reserve: slot %d, %v", i, s, ok)
		}
	}
	buckets := &tab.index.buckets[0]
	tab.Reserve(rows / 2) // below what it holds: nothing to do
	tab.Reserve(-1)
	tab.Reserve(0)
	for i := 10; i < rows; i++ {
		if _, err := tab.Insert(kvRow(int64(i), "after")); err != nil {
			t.Fatal(err)
		}
		if &tab.index.buckets[0] != buckets {
			t.Fatalf("the index was rehashed at row %d of the %d reserved", i+1, rows)
		}
	}
	mustVerify(t, tab)
	// From empty, the index is allocated once, not at every doubling.
	clearOnly := testing.AllocsPerRun(3, p.Clear)
	clearReserve := testing.AllocsPerRun(3, func() { p.Clear(); tab.Reserve(rows) })
	if clearReserve-clearOnly != 1 {
		t.Fatalf("Reserve(%d) on an empty table made %v allocations, want 1", rows, clearReserve-clearOnly)
	}

	// A count far past the cap sizes for ReserveRowsMax only: 2 Mi rows
	// take 4 Mi buckets (32 MiB), not the 128 MiB 4*ReserveRowsMax would.
	p.Clear()
	tab.Reserve(4 * ReserveRowsMax)
	if got, want := len(tab.index.buckets), 2*ReserveRowsMax; got != want {
		t.Fatalf("Reserve(%d): %d buckets, want %d (capped at ReserveRowsMax)", 4*ReserveRowsMax, got, want)
	}
	mustVerify(t, tab)
	// Clear drops the reservation with the rows.
	p.Clear()
	if len(tab.index.buckets) != indexBucketsMin {
		t.Fatalf("%d buckets after Clear", len(tab.index.buckets))
	}
}
