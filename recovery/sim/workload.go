package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// The two tables of the simulated partition: kv has a 16-byte bytes key,
// acct a two-column key (region, id). Both have an int64 column n, which
// increments and transfers change: neither is idempotent, so a txn run
// twice, or not at all, shows in the digest.
var (
	kvSchema = partition.Schema{
		Name:    "kv",
		Columns: []partition.Column{{Name: "k", Type: wire.TypeBytes}, {Name: "v", Type: wire.TypeBytes}, {Name: "n", Type: wire.TypeInt64}},
		Key:     []int{0},
	}
	acctSchema = partition.Schema{
		Name:    "acct",
		Columns: []partition.Column{{Name: "region", Type: wire.TypeString}, {Name: "id", Type: wire.TypeInt64}, {Name: "n", Type: wire.TypeInt64}, {Name: "note", Type: wire.TypeString}},
		Key:     []int{0, 1},
	}
	regions = [...]string{"eu", "us", "ap"}
)

// procRekey is the procedure name of a primary key change: table, old
// key..., new key.... The builtins have none, and a key change is the case
// the change log must see as a delete of the old key and an insert of the
// same slot.
const procRekey = "rekey"

// newRegistry returns the builtin procedures and rekey.
func newRegistry() *partition.Registry {
	reg := partition.NewBuiltinRegistry()
	if err := reg.Register(procRekey, rekey); err != nil {
		panic(err) // the builtins have no rekey
	}
	return reg
}

var errNoRow = errors.New("sim: rekey: no row with that key")

// rekey moves the row with the old key to the new key, in the same slot. A
// new key that is taken fails the txn with nothing changed.
func rekey(tx *partition.Txn, params []wire.Value) ([]wire.Value, error) {
	if len(params) == 0 || params[0].Type != wire.TypeString {
		return nil, fmt.Errorf("%w: rekey takes the table name first", partition.ErrBadParams)
	}
	t, err := tx.Table(params[0].Str)
	if err != nil {
		return nil, err
	}
	keyCols := t.Schema().Key
	nk := len(keyCols)
	if len(params) != 1+2*nk {
		return nil, fmt.Errorf("%w: rekey of %q takes %d key values twice", partition.ErrBadParams, t.Schema().Name, nk)
	}
	slot, ok := t.LookupValues(params[1 : 1+nk])
	if !ok {
		return nil, errNoRow
	}
	row, err := t.Row(slot, nil)
	if err != nil {
		return nil, err
	}
	for i, c := range keyCols {
		row[c] = params[1+nk+i]
	}
	return nil, tx.Update(t, slot, row)
}

// newReplica returns an empty replica of the partition: the same tables in
// the same order, so table IDs agree, and an executor that knows every
// initiator whose feed to it is open (fed).
func (w *world) newReplica(fed func(*initiator) bool) *partition.Executor {
	p := partition.New()
	for _, s := range w.schemas {
		if _, err := p.CreateTable(s); err != nil {
			panic(err)
		}
	}
	e := partition.NewExecutor(p, w.reg, partition.ExecutorConfig{QueueTxnsMax: 1 << 20})
	for _, in := range w.inits {
		if fed(in) {
			e.AddInitiator(in.id)
		}
	}
	return e
}

// kvKey is key i of kv: i big-endian, then a hash of i, so keys do not sort
// like their numbers.
func kvKey(i int) []byte {
	var k [16]byte
	binary.BigEndian.PutUint64(k[:], uint64(i))
	binary.BigEndian.PutUint64(k[8:], uint64(i)*0x9e3779b97f4a7c15)
	return k[:]
}

// keyValues returns key i of table t (0 kv, 1 acct) as the values of its
// key columns.
func (w *world) keyValues(t, i int) []wire.Value {
	if t == 0 {
		return []wire.Value{wire.Bytes(kvKey(i))}
	}
	return []wire.Value{wire.String(regions[i%len(regions)]), wire.Int64(int64(i / len(regions)))}
}

// keyName renders key values for the trace: k17 or eu/5.
func keyName(vals []wire.Value) string {
	switch {
	case len(vals) == 1 && vals[0].Type == wire.TypeBytes && len(vals[0].Bytes) == 16:
		return fmt.Sprintf("k%d", binary.BigEndian.Uint64(vals[0].Bytes))
	case len(vals) == 2 && vals[0].Type == wire.TypeString && vals[1].Type == wire.TypeInt64:
		return fmt.Sprintf("%s/%d", vals[0].Str, vals[1].Int)
	}
	return fmt.Sprint(vals)
}

// keySpace is how many keys of each table the workload writes: twice the
// loaded rows, so inserts find free keys and deletes and updates miss now
// and then.
func (w *world) keySpace() int { return 2 * w.k.Rows }

// row returns a full row of table t with key i.
func (w *world) row(r *rand.Rand, t, i int) []wire.Value {
	key := w.keyValues(t, i)
	n := wire.Int64(r.Int64N(100))
	if t == 0 {
		v := make([]byte, r.IntN(48))
		for j := range v {
			v[j] = byte('a' + r.IntN(26))
		}
		return []wire.Value{key[0], wire.Bytes(v), n}
	}
	note := make([]byte, r.IntN(24))
	for j := range note {
		note[j] = byte('a' + r.IntN(26))
	}
	return []wire.Value{key[0], key[1], n, wire.String(string(note))}
}

// load fills p with the initial rows: keys 0, 2, 4, ... of each table, so
// half the key space is free.
func (w *world) load(p *partition.Partition, r *rand.Rand) {
	for t, s := range w.schemas {
		tbl := p.TableByName(s.Name)
		for i := 0; i < w.k.Rows; i++ {
			if _, err := tbl.Insert(w.row(r, t, 2*i)); err != nil {
				panic(err)
			}
		}
	}
}

// op is one kind of workload txn.
type op uint8

const (
	opInsert op = iota
	opUpsert
	opUpdate
	opDelete
	opIncrement
	opRekey
	opTransfer
	opsCount
)

var opNames = [...]string{"insert", "upsert", "update", "delete", "increment", "rekey", "transfer"}

func (o op) String() string { return opNames[o] }

func parseOp(s string) (op, bool) {
	for i, n := range opNames {
		if n == s {
			return op(i), true
		}
	}
	return 0, false
}

// opWeights is how often each op is drawn, out of their sum.
var opWeights = [opsCount]int{opInsert: 10, opUpsert: 18, opUpdate: 14, opDelete: 16, opIncrement: 24, opRekey: 10, opTransfer: 8}

// txnSpec is one txn before it has an ID: what the workload, or a
// scenario script, asks for.
type txnSpec struct {
	op     op
	table  int
	key    int
	to     int // rekey's new key, transfer's credited key
	row    []wire.Value
	amount int64
}

// drawTxn draws a txn of the workload.
func (w *world) drawTxn(r *rand.Rand) txnSpec {
	total := 0
	for _, wt := range opWeights {
		total += wt
	}
	x := r.IntN(total)
	var o op
	for o = 0; x >= opWeights[o]; o++ {
		x -= opWeights[o]
	}
	sp := txnSpec{op: o, table: r.IntN(len(w.schemas)), key: r.IntN(w.keySpace()), to: r.IntN(w.keySpace()), amount: 1 + r.Int64N(9)}
	sp.row = w.row(r, sp.table, sp.key)
	return sp
}

// invocation encodes a txn spec as the procedure call every replica runs.
func (w *world) invocation(sp txnSpec) (proc string, params []wire.Value, text string) {
	name := wire.String(w.schemas[sp.table].Name)
	key := w.keyValues(sp.table, sp.key)
	kn := keyName(key)
	switch sp.op {
	case opInsert, opUpsert, opUpdate:
		row := sp.row
		if row == nil {
			row = w.row(rand.New(rand.NewPCG(uint64(sp.key), 1)), sp.table, sp.key)
		}
		return sp.op.String(), append([]wire.Value{name}, row...), fmt.Sprintf("%s %s %s", sp.op, w.schemas[sp.table].Name, kn)
	case opDelete:
		return partition.ProcDelete, append([]wire.Value{name}, key...), fmt.Sprintf("delete %s %s", w.schemas[sp.table].Name, kn)
	case opIncrement:
		return partition.ProcIncrement, append([]wire.Value{name, wire.String("n"), wire.Int64(sp.amount)}, key...),
			fmt.Sprintf("increment %s %s by %d", w.schemas[sp.table].Name, kn, sp.amount)
	case opRekey:
		to := w.keyValues(sp.table, sp.to)
		return procRekey, append(append([]wire.Value{name}, key...), to...), fmt.Sprintf("rekey %s %s to %s", w.schemas[sp.table].Name, kn, keyName(to))
	case opTransfer:
		to := w.keyValues(sp.table, sp.to)
		return partition.ProcTransfer, append(append([]wire.Value{name, wire.String("n"), wire.Int64(sp.amount)}, key...), to...),
			fmt.Sprintf("transfer %d %s %s to %s", sp.amount, w.schemas[sp.table].Name, kn, keyName(to))
	}
	panic(fmt.Sprintf("sim: op %d", sp.op))
}
