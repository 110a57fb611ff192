package partition

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

func TestCreateTable(t *testing.T) {
	p := New()
	if p.Table(0) != nil || p.Table(1) != nil || p.TableByName("kv") != nil || len(p.Tables()) != 0 {
		t.Fatal("empty partition has tables")
	}
	a, err := p.CreateTable(kvSchema())
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.CreateTable(compSchema())
	if err != nil {
		t.Fatal(err)
	}
	if a.ID() != 1 || b.ID() != 2 {
		t.Fatalf("IDs %d, %d; want 1, 2", a.ID(), b.ID())
	}
	if p.Table(1) != a || p.Table(2) != b || p.Table(3) != nil || p.TableByName("comp") != b {
		t.Fatal("lookup by ID or name is wrong")
	}
	if got := p.Tables(); len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("Tables() = %v", got)
	}
	if _, err := p.CreateTable(kvSchema()); !errors.Is(err, ErrTableExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	if _, err := p.CreateTable(Schema{Name: "bad"}); !errors.Is(err, ErrInvalidSchema) {
		t.Fatalf("invalid schema: %v", err)
	}
	if len(p.Tables()) != 2 {
		t.Fatal("a failed CreateTable added a table")
	}
}

func TestPartitionDigestIsKeyedByTable(t *testing.T) {
	// The same tuple in two tables of the same schema counts differently,
	// and the partition digest is the sum of its tables'.
	s1, s2 := kvSchema(), kvSchema()
	s2.Name = "kv2"
	p := New()
	a, _ := p.CreateTable(s1)
	b, _ := p.CreateTable(s2)
	_, _ = a.Insert(kvRow(1, "x"))
	_, _ = b.Insert(kvRow(1, "x"))
	if a.Digest() == b.Digest() {
		t.Fatal("equal tuples in different tables have the same digest")
	}
	if p.Digest() != a.Digest()+b.Digest() {
		t.Fatal("partition digest is not the sum of its tables'")
	}
	q := New()
	qa, _ := q.CreateTable(s1)
	_, _ = q.CreateTable(s2)
	_, _ = qa.Insert(kvRow(1, "x"))
	_, _ = qa.Insert(kvRow(2, "x"))
	if q.Digest() == p.Digest() {
		t.Fatal("moving a row to another table kept the digest")
	}
}

// propTable describes a table for the property test: how to make the row
// of key number k with a payload.
type propTable struct {
	schema Schema
	row    func(k int, payload []byte) []wire.Value
}

var propTables = []propTable{
	{kvSchema(), func(k int, v []byte) []wire.Value { return kvRow(int64(k)-5, string(v)) }},
	{compSchema(), func(k int, v []byte) []wire.Value {
		return []wire.Value{wire.Bytes(v), wire.Int64(int64(k % 7)), wire.Float64(float64(len(v)) / 3), wire.String(fmt.Sprint("b", k/7))}
	}},
}

// smallArena makes chunks tiny and compaction eager, so a few dozen rows
// exercise chunk turnover, oversize tuples, and compaction in every phase.
var smallArena = arenaConfig{chunkMin: 64, chunkMax: 512, oversize: 128, garbageMin: 0, stepSlots: 3, stepBytes: 256}

// model is what the table should hold: rows by canonical key, and the
// slot allocator's expected state.
type model struct {
	rows map[string]modelRow
	free []Slot // the free list, most recently freed last
	hwm  Slot
}

type modelRow struct {
	slot  Slot
	tuple []byte
}

func (m *model) takeSlot() Slot {
	if n := len(m.free); n > 0 {
		s := m.free[n-1]
		m.free = m.free[:n-1]
		return s
	}
	m.hwm++
	return m.hwm - 1
}

func (m *model) digest(id TableID) uint64 {
	var d uint64
	for _, r := range m.rows {
		d += RowHash(id, r.tuple)
	}
	return d
}

// propRun drives one table through random writes, checking it against the
// model after every step.
type propRun struct {
	t    *testing.T
	rng  *rand.Rand
	p    *Partition
	tab  *Table
	pt   propTable
	rec  *recorder
	m    model
	enc  *wire.TupleEncoder
	keys int // key numbers are in [0, keys)
}

func (r *propRun) payload() []byte {
	n := r.rng.IntN(24)
	if r.rng.IntN(8) == 0 {
		n = r.rng.IntN(400)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.rng.IntN(26))
	}
	return b
}

func (r *propRun) tupleKey(tuple []byte) string {
	offs := make([]int, len(r.pt.schema.Columns)+1)
	if _, err := wire.ScanTuple(tuple, r.pt.schema.Types(), offs); err != nil {
		r.t.Fatal(err)
	}
	return string(wire.AppendKey(nil, tuple, offs, r.pt.schema.Key))
}

func (r *propRun) encode(vals []wire.Value) []byte {
	b, err := r.enc.AppendTuple(nil, vals)
	if err != nil {
		r.t.Fatal(err)
	}
	return b
}

// randomLive returns a live slot and its key, or false if there is none.
func (r *propRun) randomLive() (Slot, string, bool) {
	if len(r.m.rows) == 0 {
		return 0, "", false
	}
	keys := slices.Sorted(maps.Keys(r.m.rows))
	k := keys[r.rng.IntN(len(keys))]
	return r.m.rows[k].slot, k, true
}

// deadSlot returns a slot that holds no row: a free one or one past the end.
func (r *propRun) deadSlot() Slot {
	if len(r.m.free) > 0 && r.rng.IntN(2) == 0 {
		return r.m.free[r.rng.IntN(len(r.m.free))]
	}
	return r.m.hwm + Slot(r.rng.IntN(3))
}

func (r *propRun) step(i int) {
	t := r.t
	id := r.tab.ID()
	var want []string
	var wantErr error
	fail := func(err error, target error, what string) {
		t.Helper()
		if !errors.Is(err, target) {
			t.Fatalf("step %d %s: error %v, want %v", i, what, err, target)
		}
	}
	ok := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("step %d %s: %v", i, what, err)
		}
	}
	before := stateOf(r.p, r.tab, r.rec)
	op := r.rng.IntN(100)
	switch {
	case op < 25: // insert
		row := r.pt.row(r.rng.IntN(r.keys), r.payload())
		tuple := r.encode(row)
		key := r.tupleKey(tuple)
		var s Slot
		var err error
		if r.rng.IntN(2) == 0 {
			s, err = r.tab.Insert(row)
		} else {
			s, err = r.tab.InsertTuple(tuple)
		}
		if _, dup := r.m.rows[key]; dup {
			wantErr = ErrDuplicateKey
			fail(err, wantErr, "insert of a live key")
			break
		}
		ok(err, "insert")
		if ws := r.m.takeSlot(); s != ws {
			t.Fatalf("step %d: insert took slot %d, want %d", i, s, ws)
		}
		r.m.rows[key] = modelRow{s, tuple}
		want = []string{fmt.Sprintf("ins %d %d", id, s)}
	case op < 45: // update keeping the key
		s, key, live := r.randomLive()
		if !live {
			break
		}
		old, _ := r.tab.Row(s, nil)
		row := r.pt.row(0, r.payload())
		for _, c := range r.pt.schema.Key {
			row[c] = old[c]
		}
		tuple := r.encode(row)
		if r.rng.IntN(2) == 0 {
			ok(r.tab.Update(s, row), "update")
		} else {
			ok(r.tab.UpdateTuple(s, tuple), "update tuple")
		}
		r.m.rows[key] = modelRow{s, tuple}
		want = []string{fmt.Sprintf("upd %d %d", id, s)}
	case op < 55: // update changing the key
		s, key, live := r.randomLive()
		if !live {
			break
		}
		tuple := r.encode(r.pt.row(r.rng.IntN(r.keys), r.payload()))
		nkey := r.tupleKey(tuple)
		err := r.tab.UpdateTuple(s, tuple)
		switch _, taken := r.m.rows[nkey]; {
		case nkey == key:
			ok(err, "update to the same key")
			want = []string{fmt.Sprintf("upd %d %d", id, s)}
		case taken:
			wantErr = ErrDuplicateKey
			fail(err, wantErr, "key change onto a live key")
		default:
			ok(err, "key change")
			delete(r.m.rows, key)
			want = []string{fmt.Sprintf("del %d %d %x", id, s, key), fmt.Sprintf("ins %d %d", id, s)}
		}
		if wantErr == nil {
			r.m.rows[nkey] = modelRow{s, tuple}
		}
	case op < 65: // delete, by slot or by key
		if r.rng.IntN(2) == 0 {
			s, key, live := r.randomLive()
			if !live {
				break
			}
			ok(r.tab.Delete(s), "delete")
			delete(r.m.rows, key)
			r.m.free = append(r.m.free, s)
			want = []string{fmt.Sprintf("del %d %d %x", id, s, key)}
			break
		}
		key := r.tupleKey(r.encode(r.pt.row(r.rng.IntN(r.keys), nil)))
		found, err := r.tab.DeleteKey([]byte(key))
		ok(err, "delete key")
		mr, live := r.m.rows[key]
		if found != live {
			t.Fatalf("step %d: DeleteKey found %v, model %v", i, found, live)
		}
		if live {
			delete(r.m.rows, key)
			r.m.free = append(r.m.free, mr.slot)
			want = []string{fmt.Sprintf("del %d %d %x", id, mr.slot, key)}
		}
	case op < 75: // upsert
		tuple := r.encode(r.pt.row(r.rng.IntN(r.keys), r.payload()))
		key := r.tupleKey(tuple)
		s, err := r.tab.Upsert(tuple)
		ok(err, "upsert")
		if mr, live := r.m.rows[key]; live {
			if s != mr.slot {
				t.Fatalf("step %d: upsert of a live key moved it from slot %d to %d", i, mr.slot, s)
			}
			want = []string{fmt.Sprintf("upd %d %d", id, s)}
		} else {
			if ws := r.m.takeSlot(); s != ws {
				t.Fatalf("step %d: upsert took slot %d, want %d", i, s, ws)
			}
			want = []string{fmt.Sprintf("ins %d %d", id, s)}
		}
		r.m.rows[key] = modelRow{s, tuple}
	case op < 80: // delete and undo it, as a rolled-back txn does
		s, key, live := r.randomLive()
		if !live {
			break
		}
		old := bytes.Clone(r.tab.Tuple(s))
		ok(r.tab.Delete(s), "delete to undo")
		ok(r.tab.InsertTupleAt(s, old), "undo delete")
		want = []string{fmt.Sprintf("del %d %d %x", id, s, key), fmt.Sprintf("ins %d %d", id, s)}
	case op < 92: // writes that must fail and change nothing
		s, _, live := r.randomLive()
		good := r.encode(r.pt.row(r.rng.IntN(r.keys), r.payload()))
		var err error
		switch r.rng.IntN(7) {
		case 0:
			wantErr = ErrSchema
			_, err = r.tab.Insert(r.pt.row(0, nil)[1:])
		case 1:
			wantErr = ErrSchema
			row := r.pt.row(r.rng.IntN(r.keys), nil)
			row[1] = wire.Float64(1)
			if live {
				err = r.tab.Update(s, row)
			} else {
				_, err = r.tab.Insert(row)
			}
		case 2:
			wantErr = ErrSchema
			_, err = r.tab.InsertTuple(append(good, 0xc0))
		case 3:
			wantErr = ErrSchema
			_, err = r.tab.Upsert(good[:len(good)-1])
		case 4:
			wantErr = ErrNoRow
			err = r.tab.UpdateTuple(r.deadSlot(), good)
		case 5:
			wantErr = ErrNoRow
			err = r.tab.Delete(r.deadSlot())
		case 6:
			wantErr = ErrSlotNotFree
			if live {
				err = r.tab.InsertTupleAt(s, good)
			} else {
				err = r.tab.InsertTupleAt(r.m.hwm, good)
			}
		}
		fail(err, wantErr, "bad write")
	default: // reads of absent keys
		key := r.tupleKey(r.encode(r.pt.row(r.keys+r.rng.IntN(10), nil)))
		if s, found := r.tab.Lookup([]byte(key)); found {
			t.Fatalf("step %d: absent key found in slot %d", i, s)
		}
	}
	if wantErr != nil {
		if after := stateOf(r.p, r.tab, r.rec); after != before {
			t.Fatalf("step %d: failed write changed the table: %+v -> %+v", i, before, after)
		}
	}
	if got := r.rec.take(); !slices.Equal(got, want) {
		t.Fatalf("step %d: events %q, want %q", i, got, want)
	}
	if len(r.rec.errs) > 0 {
		t.Fatalf("step %d: %v", i, r.rec.errs)
	}
	r.check(i)
}

// check compares the table with the model: point reads, a full slot walk,
// counts, the digest recomputed from scratch, and the table's invariants.
func (r *propRun) check(i int) {
	t := r.t
	if r.tab.Len() != len(r.m.rows) || r.tab.SlotsLen() != r.m.hwm {
		t.Fatalf("step %d: Len %d SlotsLen %d, model %d rows %d slots", i, r.tab.Len(), r.tab.SlotsLen(), len(r.m.rows), r.m.hwm)
	}
	if d := r.m.digest(r.tab.ID()); r.tab.Digest() != d || r.p.Digest() != d {
		t.Fatalf("step %d: digest %016x (partition %016x), model %016x", i, r.tab.Digest(), r.p.Digest(), d)
	}
	bySlot := make([]modelRow, 0, len(r.m.rows))
	for key, mr := range r.m.rows {
		s, found := r.tab.Lookup([]byte(key))
		if !found || s != mr.slot {
			t.Fatalf("step %d: key %x in slot %d, %v; model slot %d", i, key, s, found, mr.slot)
		}
		if !bytes.Equal(r.tab.Tuple(s), mr.tuple) {
			t.Fatalf("step %d: slot %d holds %x, model %x", i, s, r.tab.Tuple(s), mr.tuple)
		}
		bySlot = append(bySlot, mr)
	}
	slices.SortFunc(bySlot, func(a, b modelRow) int { return int(a.slot) - int(b.slot) })
	var walked [][]byte
	maxBytes := r.rng.IntN(300)
	for from := Slot(0); from < r.tab.SlotsLen(); {
		out, next, n := r.tab.AppendTuples(nil, from, maxBytes)
		if next <= from && n == 0 {
			t.Fatalf("step %d: walk stuck at %d", i, from)
		}
		walked = append(walked, splitTuples(t, r.tab, out)...)
		from = next
	}
	if len(walked) != len(bySlot) {
		t.Fatalf("step %d: walk found %d tuples, model %d", i, len(walked), len(bySlot))
	}
	for j := range walked {
		if !bytes.Equal(walked[j], bySlot[j].tuple) {
			t.Fatalf("step %d: walk tuple %d is %x, model slot %d holds %x", i, j, walked[j], bySlot[j].slot, bySlot[j].tuple)
		}
	}
	mustVerify(t, r.tab)
}

func TestTableProperty(t *testing.T) {
	const steps = 1500
	for _, pt := range propTables {
		for _, arenaName := range []string{"default", "small"} {
			for seed := uint64(1); seed <= 3; seed++ {
				t.Run(fmt.Sprintf("schema=%s/arena=%s/seed=%d", pt.schema.Name, arenaName, seed), func(t *testing.T) {
					p, tab := newTestTable(t, pt.schema)
					if arenaName == "small" {
						tab.arena.cfg = smallArena
					}
					r := &propRun{
						t: t, rng: rand.New(rand.NewPCG(seed, 0x5eed)), p: p, tab: tab, pt: pt,
						rec: &recorder{p: p}, m: model{rows: map[string]modelRow{}},
						enc: wire.NewTupleEncoder(), keys: 48,
					}
					p.SetObserver(r.rec)
					for i := range steps {
						r.step(i)
					}
					if len(r.m.rows) == 0 {
						t.Fatal("the run ended empty; the op mix is off")
					}
					t.Logf("%d rows, %d slots, arena %d of %d bytes live in %d chunks", tab.Len(), tab.SlotsLen(), tab.arena.liveBytes, tab.arena.capBytes, len(tab.arena.chunks))
					// Another replica reaches the same rows by another road:
					// junk rows come and go, rows arrive in another order and
					// are rewritten before they settle. Same digest.
					replayElsewhere(t, r, seed)
				})
			}
		}
	}
}

func replayElsewhere(t *testing.T, r *propRun, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0xd1ff))
	p2, tab2 := newTestTable(t, r.pt.schema)
	tab2.arena.cfg = smallArena
	final := slices.Collect(maps.Values(r.m.rows))
	rng.Shuffle(len(final), func(i, j int) { final[i], final[j] = final[j], final[i] })
	var junk []Slot
	for i, mr := range final {
		if rng.IntN(3) == 0 {
			// A junk row with a key outside the run's keys.
			s, err := tab2.Insert(r.pt.row(r.keys+i, r.payload()))
			if err != nil {
				t.Fatal(err)
			}
			junk = append(junk, s)
		}
		// Insert a wrong version first, then correct it by upsert.
		if rng.IntN(2) == 0 {
			key := r.tupleKey(mr.tuple)
			wrong := r.pt.row(0, r.payload())
			old, _, _ := wire.DecodeTuple(mr.tuple, r.pt.schema.Types(), nil)
			for _, c := range r.pt.schema.Key {
				wrong[c] = old[c]
			}
			s, err := tab2.Insert(wrong)
			if err != nil {
				t.Fatal(err)
			}
			if ls, _ := tab2.Lookup([]byte(key)); ls != s {
				t.Fatal("lookup after insert")
			}
		}
		if _, err := tab2.Upsert(mr.tuple); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range junk {
		if err := tab2.Delete(s); err != nil {
			t.Fatal(err)
		}
	}
	mustVerify(t, tab2)
	if tab2.Len() != r.tab.Len() || tab2.Digest() != r.tab.Digest() || p2.Digest() != r.p.Digest() {
		t.Fatalf("replica by another road: Len %d digest %016x; original Len %d digest %016x", tab2.Len(), tab2.Digest(), r.tab.Len(), r.tab.Digest())
	}
}
