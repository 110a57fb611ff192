package partition

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

// upsertMany returns the params of upsert_many on accounts for rows.
func upsertMany(rows ...[]wire.Value) []wire.Value {
	vals := []wire.Value{wire.String("accounts"), wire.Int64(int64(len(rows)))}
	for _, r := range rows {
		vals = append(vals, r...)
	}
	return vals
}

func TestUpsertMany(t *testing.T) {
	p, tbl := newAccounts(t)
	reg := NewBuiltinRegistry()
	tx := NewTxn(p)
	if _, err := run(t, reg, tx, ProcInsert, withTable("accounts", account("eu", 1, 100, "a"))...); err != nil {
		t.Fatal(err)
	}
	res, err := run(t, reg, tx, ProcUpsertMany, upsertMany(
		account("eu", 1, 101, "updated"),
		account("eu", 2, 5, "new"),
		account("us", 1, 7, "x"),
		account("us", 1, 8, "same key twice: the later wins"),
	)...)
	if err != nil || len(res) != 0 {
		t.Fatalf("upsert_many = %v, %v; want ()", res, err)
	}
	if tbl.Len() != 3 {
		t.Fatalf("len %d, want 3", tbl.Len())
	}
	for _, want := range [][]wire.Value{
		account("eu", 1, 101, "updated"),
		account("eu", 2, 5, "new"),
		account("us", 1, 8, "same key twice: the later wins"),
	} {
		got, err := run(t, reg, tx, ProcRead, wire.String("accounts"), want[0], want[1])
		if err != nil || !valuesEqual(got, want) {
			t.Fatalf("read %v = %v, %v", want[:2], got, err)
		}
	}
}

// A bad row anywhere fails the whole txn, and the rows before it, written
// already, are rolled back.
func TestUpsertManyAllOrNothing(t *testing.T) {
	p, _ := newAccounts(t)
	reg := NewBuiltinRegistry()
	tx := NewTxn(p)
	if _, err := run(t, reg, tx, ProcUpsertMany, upsertMany(account("eu", 1, 100, "a"), account("eu", 2, 5, "b"))...); err != nil {
		t.Fatal(err)
	}
	before, digest := snapshot(p), p.Digest()
	good := account("eu", 3, 1, "c")
	update := account("eu", 1, 0, "changed")
	badType := []wire.Value{wire.String("eu"), wire.Int64(4), wire.String("not an int"), wire.Bytes(nil)}
	acc := wire.String("accounts")
	tests := []struct {
		name   string
		params []wire.Value
		want   error
	}{
		{"bad row in the middle", upsertMany(good, update, badType, account("eu", 5, 1, "d")), ErrSchema},
		{"bad row last", upsertMany(update, good, badType), ErrSchema},
		{"one field extra", append(upsertMany(good, update), wire.Int64(1)), ErrBadParams},
		{"one field short", upsertMany(good, update)[:2+2*len(good)-1], ErrBadParams},
		{"n zero", []wire.Value{acc, wire.Int64(0)}, ErrBadParams},
		{"n negative", append([]wire.Value{acc, wire.Int64(-1)}, good...), ErrBadParams},
		{"n over the limit", append([]wire.Value{acc, wire.Int64(wire.TupleFieldsMax + 1)}, good...), ErrBadParams},
		{"n not an int", append([]wire.Value{acc, wire.String("1")}, good...), ErrBadParams},
		{"n missing", []wire.Value{acc}, ErrBadParams},
		{"unknown table", append([]wire.Value{wire.String("nope"), wire.Int64(1)}, good...), ErrBadParams},
	}
	for _, tt := range tests {
		_, err := run(t, reg, tx, ProcUpsertMany, tt.params...)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.want)
		}
		if after := snapshot(p); after != before || p.Digest() != digest {
			t.Fatalf("%s changed the partition:\nbefore\n%s\nafter\n%s", tt.name, before, after)
		}
	}
}

func TestDigestProcedure(t *testing.T) {
	p, _ := newAccounts(t)
	other, err := p.CreateTable(Schema{Name: "kv", Columns: []Column{{Name: "k", Type: wire.TypeBytes}, {Name: "v", Type: wire.TypeBytes}}, Key: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	reg := NewBuiltinRegistry()
	tx := NewTxn(p)
	check := func(rows int64) {
		t.Helper()
		before := snapshot(p)
		got, err := run(t, reg, tx, ProcDigest)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Type != wire.TypeInt64 || uint64(got[0].Int) != p.Digest() || got[1].Type != wire.TypeInt64 || got[1].Int != rows {
			t.Fatalf("digest = %v; want (%d, %d)", got, int64(p.Digest()), rows)
		}
		if snapshot(p) != before || tx.Changes() != 0 {
			t.Fatal("digest changed the partition")
		}
	}
	check(0)
	if _, err := run(t, reg, tx, ProcUpsertMany, upsertMany(account("eu", 1, 100, "a"), account("eu", 2, 5, "b"))...); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Insert([]wire.Value{wire.Bytes([]byte("k")), wire.Bytes([]byte("v"))}); err != nil {
		t.Fatal(err)
	}
	check(3)
	if _, err := run(t, reg, tx, ProcDigest, wire.Int64(1)); !errors.Is(err, ErrBadParams) {
		t.Fatalf("digest with a parameter: %v", err)
	}
}

// The same rows upserted in differently sized upsert_many txns leave equal
// digests (and digest procedure results).
func TestUpsertManyBatchingDigest(t *testing.T) {
	rnd := rand.New(rand.NewPCG(7, 11))
	var rows [][]wire.Value
	for i := range 500 {
		// Few distinct keys, so later rows update earlier ones.
		rows = append(rows, account(fmt.Sprint("r", rnd.IntN(3)), rnd.Int64N(100), int64(i), fmt.Sprint("note", i)))
	}
	reg := NewBuiltinRegistry()
	var results [][]wire.Value
	var digests []uint64
	for _, batch := range []int{1, 7, 64, 500} {
		p, _ := newAccounts(t)
		tx := NewTxn(p)
		for i := 0; i < len(rows); i += batch {
			if _, err := run(t, reg, tx, ProcUpsertMany, upsertMany(rows[i:min(i+batch, len(rows))]...)...); err != nil {
				t.Fatalf("batch %d at %d: %v", batch, i, err)
			}
		}
		res, err := run(t, reg, tx, ProcDigest)
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
		digests = append(digests, p.Digest())
	}
	for i := range digests {
		if digests[i] != digests[0] || !valuesEqual(results[i], results[0]) {
			t.Fatalf("batchings disagree: digests %x, results %v", digests, results)
		}
	}
	if digests[0] == 0 || results[0][1].Int == 0 {
		t.Fatalf("empty result %v", results[0])
	}
}
