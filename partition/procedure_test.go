package partition

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

// accountsSchema is a table keyed by (region, id) with an int64 balance,
// so procedures are exercised with a multi-column key.
var accountsSchema = Schema{
	Name: "accounts",
	Columns: []Column{
		{Name: "region", Type: wire.TypeString},
		{Name: "id", Type: wire.TypeInt64},
		{Name: "balance", Type: wire.TypeInt64},
		{Name: "note", Type: wire.TypeBytes},
	},
	Key: []int{0, 1},
}

func newAccounts(t testing.TB) (*Partition, *Table) {
	t.Helper()
	p := New()
	tbl, err := p.CreateTable(accountsSchema)
	if err != nil {
		t.Fatal(err)
	}
	return p, tbl
}

func tuple(t testing.TB, vals ...wire.Value) []byte {
	t.Helper()
	b, err := wire.NewTupleEncoder().AppendTuple(nil, vals)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func account(region string, id, balance int64, note string) []wire.Value {
	return []wire.Value{wire.String(region), wire.Int64(id), wire.Int64(balance), wire.Bytes([]byte(note))}
}

func withTable(table string, vals []wire.Value) []wire.Value {
	return append([]wire.Value{wire.String(table)}, vals...)
}

// snapshot captures everything a rollback must restore: every slot's
// tuple, the row count and the digest.
func snapshot(p *Partition) string {
	var buf bytes.Buffer
	for _, t := range p.Tables() {
		fmt.Fprintf(&buf, "table %d len %d digest %x\n", t.ID(), t.Len(), t.Digest())
		for s := Slot(0); s < t.SlotsLen(); s++ {
			if tu := t.Tuple(s); tu != nil {
				fmt.Fprintf(&buf, "  %d %x\n", s, tu)
			}
		}
	}
	fmt.Fprintf(&buf, "digest %x\n", p.Digest())
	return buf.String()
}

func run(t testing.TB, reg *Registry, tx *Txn, proc string, vals ...wire.Value) ([]wire.Value, error) {
	t.Helper()
	out, err := reg.Run(tx, proc, tuple(t, vals...), nil)
	if err != nil {
		return nil, err
	}
	res, n, derr := wire.DecodeValues(out, nil)
	if derr != nil || n != len(out) {
		t.Fatalf("result of %s does not decode: %v", proc, derr)
	}
	return res, nil
}

func TestBuiltinProcedures(t *testing.T) {
	p, tbl := newAccounts(t)
	reg := NewBuiltinRegistry()
	tx := NewTxn(p)
	must := func(res []wire.Value, err error) []wire.Value {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	must(run(t, reg, tx, ProcInsert, withTable("accounts", account("eu", 1, 100, "a"))...))
	must(run(t, reg, tx, ProcInsert, withTable("accounts", account("eu", 2, 5, "b"))...))
	must(run(t, reg, tx, ProcUpsert, withTable("accounts", account("us", 1, 7, "c"))...)) // inserts
	must(run(t, reg, tx, ProcUpsert, withTable("accounts", account("us", 1, 8, "d"))...)) // updates
	must(run(t, reg, tx, ProcUpdate, withTable("accounts", account("eu", 2, 6, "e"))...))
	if tbl.Len() != 3 {
		t.Fatalf("len %d, want 3", tbl.Len())
	}

	got := must(run(t, reg, tx, ProcRead, wire.String("accounts"), wire.String("us"), wire.Int64(1)))
	if want := account("us", 1, 8, "d"); !valuesEqual(got, want) {
		t.Fatalf("read %v, want %v", got, want)
	}
	got = must(run(t, reg, tx, ProcIncrement, wire.String("accounts"), wire.String("balance"), wire.Int64(-3), wire.String("eu"), wire.Int64(2)))
	if len(got) != 1 || got[0].Int != 3 {
		t.Fatalf("increment returned %v, want (3)", got)
	}
	got = must(run(t, reg, tx, ProcTransfer, wire.String("accounts"), wire.String("balance"), wire.Int64(40),
		wire.String("eu"), wire.Int64(1), wire.String("eu"), wire.Int64(2)))
	if len(got) != 2 || got[0].Int != 60 || got[1].Int != 43 {
		t.Fatalf("transfer returned %v, want (60, 43)", got)
	}
	must(run(t, reg, tx, ProcDelete, wire.String("accounts"), wire.String("us"), wire.Int64(1)))
	if tbl.Len() != 2 {
		t.Fatalf("len %d after delete, want 2", tbl.Len())
	}
	if _, ok := tbl.LookupValues([]wire.Value{wire.String("us"), wire.Int64(1)}); ok {
		t.Fatal("deleted row still found")
	}
}

func valuesEqual(a, b []wire.Value) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// TestProcedureErrorsChangeNothing runs every kind of failing call after a
// known state and checks the state is byte for byte the same after it.
func TestProcedureErrorsChangeNothing(t *testing.T) {
	p, _ := newAccounts(t)
	reg := NewBuiltinRegistry()
	tx := NewTxn(p)
	for _, a := range [][]wire.Value{account("eu", 1, 100, "a"), account("eu", 2, 5, "b")} {
		if _, err := run(t, reg, tx, ProcInsert, withTable("accounts", a)...); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshot(p)
	acc := wire.String("accounts")
	bal := wire.String("balance")
	eu1 := []wire.Value{wire.String("eu"), wire.Int64(1)}
	eu2 := []wire.Value{wire.String("eu"), wire.Int64(2)}
	missing := []wire.Value{wire.String("xx"), wire.Int64(9)}
	cat := func(vs ...[]wire.Value) []wire.Value {
		var out []wire.Value
		for _, v := range vs {
			out = append(out, v...)
		}
		return out
	}
	tests := []struct {
		name   string
		proc   string
		params []byte
		want   error
	}{
		{"unknown procedure", "nope", tuple(t), ErrUnknownProcedure},
		{"params not a tuple", ProcInsert, []byte{0xc0}, ErrBadParams},
		{"params truncated", ProcInsert, tuple(t, withTable("accounts", account("eu", 3, 1, "z"))...)[:5], ErrBadParams},
		{"trailing bytes", ProcRead, append(tuple(t, cat([]wire.Value{acc}, eu1)...), 0x01), ErrBadParams},
		{"no table name", ProcInsert, tuple(t, wire.Int64(1)), ErrBadParams},
		{"unknown table", ProcInsert, tuple(t, withTable("nope", account("eu", 3, 1, "z"))...), ErrBadParams},
		{"duplicate key", ProcInsert, tuple(t, withTable("accounts", account("eu", 1, 1, "z"))...), ErrDuplicateKey},
		{"wrong arity", ProcInsert, tuple(t, acc, wire.String("eu")), ErrSchema},
		{"wrong type", ProcInsert, tuple(t, acc, wire.String("eu"), wire.String("1"), wire.Int64(1), wire.Bytes(nil)), ErrSchema},
		{"update missing", ProcUpdate, tuple(t, withTable("accounts", account("xx", 9, 1, "z"))...), ErrNoRow},
		{"delete missing", ProcDelete, tuple(t, cat([]wire.Value{acc}, missing)...), ErrNoRow},
		{"read missing", ProcRead, tuple(t, cat([]wire.Value{acc}, missing)...), ErrNoRow},
		{"read short key", ProcRead, tuple(t, acc, wire.String("eu")), ErrBadParams},
		{"increment key column", ProcIncrement, tuple(t, cat([]wire.Value{acc, wire.String("id"), wire.Int64(1)}, eu1)...), ErrBadParams},
		{"increment bytes column", ProcIncrement, tuple(t, cat([]wire.Value{acc, wire.String("note"), wire.Int64(1)}, eu1)...), ErrBadParams},
		{"increment float delta", ProcIncrement, tuple(t, cat([]wire.Value{acc, bal, wire.Float64(1)}, eu1)...), ErrBadParams},
		{"increment overflow", ProcIncrement, tuple(t, cat([]wire.Value{acc, bal, wire.Int64(1<<63 - 1)}, eu1)...), ErrConstraint},
		{"transfer overdraws", ProcTransfer, tuple(t, cat([]wire.Value{acc, bal, wire.Int64(6)}, eu2, eu1)...), ErrConstraint},
		{"transfer zero", ProcTransfer, tuple(t, cat([]wire.Value{acc, bal, wire.Int64(0)}, eu1, eu2)...), ErrBadParams},
		// The debit applies before the credit fails: rollback must undo it.
		{"transfer to missing row", ProcTransfer, tuple(t, cat([]wire.Value{acc, bal, wire.Int64(10)}, eu1, missing)...), ErrNoRow},
	}
	for _, tt := range tests {
		_, err := reg.Run(tx, tt.proc, tt.params, nil)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.want)
		}
		if after := snapshot(p); after != before {
			t.Fatalf("%s changed the partition:\nbefore\n%s\nafter\n%s", tt.name, before, after)
		}
	}
}

// TestRollbackRestoresRandomChanges runs random changes inside a procedure
// that then fails, and checks that the partition, slots included, is
// exactly as before; a committed twin of each procedure checks the changes
// really happened.
func TestRollbackRestoresRandomChanges(t *testing.T) {
	errBoom := errors.New("boom")
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		p, tbl := newAccounts(t)
		tx := NewTxn(p)
		reg := NewRegistry()
		var fail bool
		err := reg.Register("random", func(tx *Txn, _ []wire.Value) ([]wire.Value, error) {
			for i := 0; i < 1+rng.IntN(20); i++ {
				id := int64(rng.IntN(30))
				key := []wire.Value{wire.String("r"), wire.Int64(id)}
				slot, live := tbl.LookupValues(key)
				switch op := rng.IntN(3); {
				case !live || op == 0:
					if _, err := tx.Insert(tbl, account("r", id, rng.Int64N(100), "x")); err != nil && !errors.Is(err, ErrDuplicateKey) {
						return nil, err
					}
				case op == 1:
					// Sometimes move the row to a new key.
					newID := id
					if rng.IntN(3) == 0 {
						newID = int64(rng.IntN(30))
					}
					note := bytes.Repeat([]byte{'y'}, rng.IntN(200))
					if err := tx.Update(tbl, slot, account("r", newID, rng.Int64N(100), string(note))); err != nil && !errors.Is(err, ErrDuplicateKey) {
						return nil, err
					}
				default:
					if err := tx.Delete(tbl, slot); err != nil {
						return nil, err
					}
				}
			}
			if fail {
				return nil, errBoom
			}
			return nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for round := 0; round < 40; round++ {
			fail = rng.IntN(2) == 0
			before := snapshot(p)
			_, err := reg.Run(tx, "random", tuple(t), nil)
			after := snapshot(p)
			if fail {
				if !errors.Is(err, errBoom) {
					t.Fatalf("seed %d round %d: err %v, want boom", seed, round, err)
				}
				if after != before {
					t.Fatalf("seed %d round %d: rollback left changes:\nbefore\n%s\nafter\n%s", seed, round, before, after)
				}
			} else if err != nil {
				t.Fatalf("seed %d round %d: %v", seed, round, err)
			}
		}
	}
}

func TestRegistry(t *testing.T) {
	reg := NewBuiltinRegistry()
	if got := len(reg.Names()); got != 9 {
		t.Fatalf("%d built-ins, want 9: %v", got, reg.Names())
	}
	if err := reg.Register(ProcInsert, procInsert); err == nil {
		t.Fatal("registering a name twice succeeded")
	}
	if err := reg.Register("", procInsert); err == nil {
		t.Fatal("registering an empty name succeeded")
	}
	if err := reg.Register("x", nil); err == nil {
		t.Fatal("registering a nil procedure succeeded")
	}
}
