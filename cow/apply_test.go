package cow

import (
	"errors"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// tupleOf encodes vals as one tuple.
func tupleOf(t *testing.T, vals ...wire.Value) []byte {
	t.Helper()
	b, err := wire.NewTupleEncoder().AppendTuple(nil, vals)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// state is what a rejected block must leave unchanged.
type state struct {
	digest uint64
	lens   [3]int
	rows   string
}

func stateOf(p *partition.Partition) state {
	st := state{digest: p.Digest(), rows: content(p)}
	for i := range st.lens {
		st.lens[i] = p.Table(partition.TableID(i + 1)).Len()
	}
	return st
}

func recount(b Block, n uint32) Block { b.Count = n; return b }

func withTrailingByte(b Block) Block { b.Tuples = append(b.Tuples, 0x00); return b }

// Apply checks the whole block before it writes anything: each bad block
// below has good tuples before its fault, which a block applied tuple by
// tuple would have written.
func TestApplyRejects(t *testing.T) {
	good1 := tupleOf(t, intRow(1, "one")...)
	good2 := tupleOf(t, intRow(2, "two")...)
	key1 := intKey(3)
	pair := tupleOf(t, pairRow("eu", 1, "p", 1)...)
	truncated := good2[:len(good2)-1]
	nonCanonical := append([]byte{0x92, 0xd0, 0x05}, good2[2:]...) // int8 form of 5
	for _, c := range []struct {
		name string
		b    Block
		want error
	}{
		{"unknown kind", Block{Kind: 0, Table: 1, Count: 1, Tuples: makeBlock(wire.BlockUpserts, 1, good1).Tuples}, ErrBadBlock},
		{"unknown table", makeBlock(wire.BlockSnapshot, 99, good1), ErrUnknownTable},
		{"table zero", makeBlock(wire.BlockUpserts, 0, good1), ErrUnknownTable},
		{"count above the header", recount(makeBlock(wire.BlockSnapshot, 1, good1, good2), 3), ErrBadBlock},
		{"count below the header", recount(makeBlock(wire.BlockSnapshot, 1, good1, good2), 1), ErrBadBlock},
		{"no array header", Block{Kind: wire.BlockSnapshot, Table: 1, Count: 1, Tuples: good1}, ErrBadBlock},
		{"truncated tuple", makeBlock(wire.BlockSnapshot, 1, good1, truncated), ErrBadBlock},
		{"trailing bytes", withTrailingByte(makeBlock(wire.BlockUpserts, 1, good1, good2)), ErrBadBlock},
		{"non-canonical tuple", makeBlock(wire.BlockUpserts, 1, good1, nonCanonical), wire.ErrNonCanonical},
		{"row of another table", makeBlock(wire.BlockSnapshot, 1, good1, pair), ErrBadBlock},
		{"rows of ints sent to pairs", makeBlock(wire.BlockUpserts, 3, good1), ErrBadBlock},
		{"row where a key belongs", deleteBlock(1, key1, good1), ErrBadBlock},
		{"key where a row belongs", makeBlock(wire.BlockUpserts, 1, good1, key1), ErrBadBlock},
		{"wrong key type", deleteBlock(1, key1, tupleOf(t, wire.String("3"))), wire.ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := newTestPartition(t)
			mustInsert(t, dst, tabInts, intRow(3, "three"))
			mustInsert(t, dst, tabPairs, pairRow("us", 9, "q", 2))
			before := stateOf(dst)
			err := Apply(dst, c.b)
			if !errors.Is(err, c.want) {
				t.Fatalf("Apply = %v, want %v", err, c.want)
			}
			if !errors.Is(err, ErrBadBlock) && !errors.Is(err, ErrUnknownTable) {
				t.Fatalf("Apply = %v, not classified as a cow error", err)
			}
			if after := stateOf(dst); after != before {
				t.Fatalf("a rejected block changed the destination: %+v, was %+v", after, before)
			}
		})
	}
}

// Applying a block twice is harmless: rows by key, deletes of missing keys.
func TestApplyIdempotent(t *testing.T) {
	dst := newTestPartition(t)
	rows := makeBlock(wire.BlockSnapshot, 1, tupleOf(t, intRow(1, "a")...), tupleOf(t, intRow(2, "b")...))
	dels := deleteBlock(1, intKey(1), intKey(42))
	var a Applier
	for range 2 {
		if err := a.Apply(dst, rows); err != nil {
			t.Fatal(err)
		}
	}
	if n := dst.Table(1).Len(); n != 2 {
		t.Fatalf("%d rows after a block applied twice, want 2", n)
	}
	for range 2 {
		if err := a.Apply(dst, dels); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := intValue(t, dst, 1); ok {
		t.Fatal("row 1 survived its delete")
	}
	if v, _ := intValue(t, dst, 2); v != "b" {
		t.Fatalf("row 2 = %q, want b", v)
	}
	if err := a.Apply(dst, Block{Kind: wire.BlockUpserts, Table: 1}); err != nil {
		t.Fatalf("empty block: %v", err)
	}
	if err := a.Apply(dst, makeBlock(wire.BlockUpserts, 1)); err != nil {
		t.Fatalf("empty block with a header: %v", err)
	}
}
