package cow

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// The property test's workload: procedures over the three test tables
// that make every kind of change a change log must get right, generated
// from a seed independently of how the run is scheduled, so that runs of
// one seed with different block sizes execute the same txns in the same
// order and must end with the same content.

// Extra procedures, beyond partition's built-ins. Each takes the table
// name first; keys are the values of the key columns in key order.
const (
	procRekey = "rekey" // table, old key..., new row...: a primary key change in place
	procChurn = "churn" // table, key..., row...: delete the row, insert row (the freed slot comes back)
	procMove  = "move"  // table, key..., filler..., row...: delete, insert filler (takes the slot), insert row elsewhere
	procFail  = "fail"  // table, row...: upsert the row, then fail: the txn rolls back
)

var errDeliberate = errors.New("deliberate failure")

func testRegistry(t testing.TB) *partition.Registry {
	t.Helper()
	r := partition.NewBuiltinRegistry()
	for name, p := range map[string]partition.Procedure{
		procRekey: procRekeyFn,
		procChurn: procChurnFn,
		procMove:  procMoveFn,
		procFail:  procFailFn,
	} {
		if err := r.Register(name, p); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// splitParams takes the table and then cuts the rest into parts of the
// given widths, where -1 stands for the key's width and -2 for a row's.
func splitParams(tx *partition.Txn, params []wire.Value, widths ...int) (*partition.Table, [][]wire.Value, error) {
	if len(params) == 0 || params[0].Type != wire.TypeString {
		return nil, nil, fmt.Errorf("%w: no table name", partition.ErrBadParams)
	}
	t, err := tx.Table(params[0].Str)
	if err != nil {
		return nil, nil, err
	}
	rest := params[1:]
	parts := make([][]wire.Value, len(widths))
	for i, w := range widths {
		switch w {
		case -1:
			w = len(t.Schema().Key)
		case -2:
			w = len(t.Schema().Columns)
		}
		if len(rest) < w {
			return nil, nil, fmt.Errorf("%w: too few values", partition.ErrBadParams)
		}
		parts[i], rest = rest[:w], rest[w:]
	}
	if len(rest) != 0 {
		return nil, nil, fmt.Errorf("%w: %d values too many", partition.ErrBadParams, len(rest))
	}
	return t, parts, nil
}

func lookup(t *partition.Table, key []wire.Value) (partition.Slot, error) {
	s, ok := t.LookupValues(key)
	if !ok {
		return 0, fmt.Errorf("%w: key %v", partition.ErrNoRow, key)
	}
	return s, nil
}

func procRekeyFn(tx *partition.Txn, params []wire.Value) ([]wire.Value, error) {
	t, parts, err := splitParams(tx, params, -1, -2)
	if err != nil {
		return nil, err
	}
	s, err := lookup(t, parts[0])
	if err != nil {
		return nil, err
	}
	return nil, tx.Update(t, s, parts[1])
}

func procChurnFn(tx *partition.Txn, params []wire.Value) ([]wire.Value, error) {
	t, parts, err := splitParams(tx, params, -1, -2)
	if err != nil {
		return nil, err
	}
	s, err := lookup(t, parts[0])
	if err != nil {
		return nil, err
	}
	if err := tx.Delete(t, s); err != nil {
		return nil, err
	}
	_, err = tx.Insert(t, parts[1])
	return nil, err
}

func procMoveFn(tx *partition.Txn, params []wire.Value) ([]wire.Value, error) {
	t, parts, err := splitParams(tx, params, -1, -2, -2)
	if err != nil {
		return nil, err
	}
	s, err := lookup(t, parts[0])
	if err != nil {
		return nil, err
	}
	if err := tx.Delete(t, s); err != nil {
		return nil, err
	}
	if _, err := tx.Insert(t, parts[1]); err != nil {
		return nil, err
	}
	_, err = tx.Insert(t, parts[2])
	return nil, err
}

func procFailFn(tx *partition.Txn, params []wire.Value) ([]wire.Value, error) {
	t, parts, err := splitParams(tx, params, -2)
	if err != nil {
		return nil, err
	}
	key := make([]wire.Value, 0, len(t.Schema().Key))
	for _, k := range t.Schema().Key {
		key = append(key, parts[0][k])
	}
	if s, ok := t.LookupValues(key); ok {
		err = tx.Update(t, s, parts[0])
	} else {
		_, err = tx.Insert(t, parts[0])
	}
	if err != nil {
		return nil, err
	}
	return nil, errDeliberate
}

// gen makes random rows and keys of the test tables over small key
// spaces, so that inserts collide, deletes find rows, and keys come back.
type gen struct {
	rng *rand.Rand
}

// Key spaces of the test tables.
const (
	intKeys  = 60
	blobKeys = 48
	pairNs   = 16 // per region
)

var valueText = strings.Repeat("the quick brown fox jumps over the lazy dog 0123456789 ", 8)

// value returns a value of random length: mostly short, sometimes over
// 255 bytes so that an update changes the header's size and grows the row.
func (g gen) value() string {
	n := g.rng.IntN(40)
	if g.rng.IntN(6) == 0 {
		n = 200 + g.rng.IntN(120)
	}
	// Slices of one fixed text at a random offset: distinct enough, and
	// cheap, which matters for a test that makes thousands of rows.
	off := g.rng.IntN(len(valueText) - n)
	return valueText[off : off+n]
}

// key returns the key values of a random key of table name.
func (g gen) key(name string) []wire.Value {
	switch name {
	case tabInts:
		return []wire.Value{wire.Int64(int64(g.rng.IntN(intKeys)))}
	case tabBlobs:
		return []wire.Value{wire.Bytes(blobKey(g.rng.IntN(blobKeys)))}
	}
	return []wire.Value{wire.String(regions[g.rng.IntN(len(regions))]), wire.Int64(int64(g.rng.IntN(pairNs)))}
}

// row returns a row of table name with key key and random other fields.
func (g gen) row(name string, key []wire.Value) []wire.Value {
	switch name {
	case tabInts:
		return []wire.Value{key[0], wire.Bytes([]byte(g.value()))}
	case tabBlobs:
		return []wire.Value{key[0], wire.String(g.value())}
	}
	return []wire.Value{wire.Bytes([]byte(g.value())), key[0], key[1], wire.Int64(g.rng.Int64N(1000) - 500)}
}

var tableNames = []string{tabInts, tabBlobs, tabPairs}

// load returns rows that fill about two thirds of every key space and the
// keys of a few of them to delete then, so that free slots exist when the
// stream starts. Duplicate keys among the rows are skipped at loading.
func (g gen) load() (rows []loadRow) {
	for _, name := range tableNames {
		for range 40 {
			rows = append(rows, loadRow{table: name, vals: g.row(name, g.key(name))})
		}
		for range 5 {
			rows = append(rows, loadRow{table: name, vals: g.key(name), delete: true})
		}
	}
	return rows
}

// loadRow is one write of the initial load.
type loadRow struct {
	table  string
	vals   []wire.Value // a row, or a key to delete
	delete bool
}

// loadInto applies rows to p.
func loadInto(t testing.TB, p *partition.Partition, rows []loadRow) {
	for _, r := range rows {
		tab := p.TableByName(r.table)
		if !r.delete {
			_, _ = tab.Insert(r.vals) // a duplicate key is skipped
			continue
		}
		if s, ok := tab.LookupValues(r.vals); ok {
			if err := tab.Delete(s); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// invocation is one txn of the workload, without its ID.
type invocation struct {
	proc   string
	params []byte
}

// workload returns n random txns.
func (g gen) workload(t testing.TB, n int) []invocation {
	t.Helper()
	enc := wire.NewTupleEncoder()
	out := make([]invocation, 0, n)
	for range n {
		name := tableNames[g.rng.IntN(len(tableNames))]
		tv := []wire.Value{wire.String(name)}
		key := g.key(name)
		var proc string
		var vals []wire.Value
		switch r := g.rng.IntN(100); {
		case r < 20:
			proc, vals = partition.ProcInsert, g.row(name, key)
		case r < 40:
			proc, vals = partition.ProcUpsert, g.row(name, key)
		case r < 52:
			proc, vals = partition.ProcUpdate, g.row(name, key)
		case r < 70:
			proc, vals = partition.ProcDelete, key
		case r < 78:
			proc, vals = procRekey, append(key, g.row(name, g.key(name))...)
		case r < 86:
			proc, vals = procChurn, append(key, g.row(name, key)...)
		case r < 94:
			proc, vals = procMove, append(append(key, g.row(name, g.key(name))...), g.row(name, key)...)
		default:
			proc, vals = procFail, g.row(name, key)
		}
		params, err := enc.AppendTuple(nil, append(tv, vals...))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, invocation{proc: proc, params: params})
	}
	return out
}

// source is a partition run by an executor, fed from one initiator.
type source struct {
	p   *partition.Partition
	ex  *partition.Executor
	ids *txnid.Generator
	now int64
}

func newSource(t testing.TB) *source {
	t.Helper()
	src := &source{p: newTestPartition(t), now: txnid.EpochUnixMillis + 1000}
	src.ex = partition.NewExecutor(src.p, testRegistry(t), partition.ExecutorConfig{})
	src.ex.AddInitiator(1)
	ids, err := txnid.NewGenerator(1, func() int64 { return src.now })
	if err != nil {
		t.Fatal(err)
	}
	src.ids = ids
	return src
}

// offer queues inv as the initiator's next txn.
func (src *source) offer(t testing.TB, inv invocation) {
	src.now++
	if err := src.ex.Offer(partition.Invocation{ID: src.ids.Next(), Proc: inv.proc, Params: inv.params}); err != nil {
		t.Fatal(err)
	}
}
