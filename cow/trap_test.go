package cow

import (
	"testing"

	"github.com/rejoin-db/rejoin/partition"
)

// The trap tests build, one by one, the change sequences of DESIGN.md
// step 6 that a change log gets wrong most easily, each on a source whose
// ints table holds rows 0..9 in slots 0..9 with the snapshot cursor at
// slot 5 (one-row blocks, five cut), and assert the destination's rows.

// trapSetup returns the source, the destination and a stream whose
// cursor is at slot 5 of the ints table.
func trapSetup(t *testing.T) (src, dst *partition.Partition, s *Stream, sh *shipper) {
	t.Helper()
	src, dst = newTestPartition(t), newTestPartition(t)
	for i := range int64(10) {
		if got := mustInsert(t, src, tabInts, intRow(i, "old")); got != partition.Slot(i) {
			t.Fatalf("row %d in slot %d", i, got)
		}
	}
	s, sh = activate(t, src, dst, testConfig())
	sh.blocks(5)
	if s.snapTable != 0 || s.snapPos != 5 {
		t.Fatalf("cursor at table %d slot %d, want 0, 5", s.snapTable, s.snapPos)
	}
	return src, dst, s, sh
}

func wantInt(t *testing.T, p *partition.Partition, id int64, want string) {
	t.Helper()
	got, ok := intValue(t, p, id)
	switch {
	case want == "" && ok:
		t.Fatalf("destination has row %d = %q, want none", id, got)
	case want != "" && !ok:
		t.Fatalf("destination has no row %d, want %q", id, want)
	case got != want:
		t.Fatalf("destination row %d = %q, want %q", id, got, want)
	}
}

// A key deleted behind the cursor and inserted again ahead of it reaches
// the destination through the snapshot after its delete was logged: the
// delete must be dropped when the round cuts it.
func TestTrapDeleteBehindReinsertAhead(t *testing.T) {
	src, dst, s, sh := trapSetup(t)
	tab := src.TableByName(tabInts)
	if err := tab.Delete(intSlot(t, src, 2)); err != nil { // slot 2: behind, key logged
		t.Fatal(err)
	}
	mustInsert(t, src, tabInts, intRow(100, "filler")) // takes slot 2 back
	if got := mustInsert(t, src, tabInts, intRow(2, "new")); got != 10 {
		t.Fatalf("reinserted row 2 went to slot %d, want 10 (ahead)", got)
	}
	sh.drain() // the snapshot ships slot 10: row 2 = new
	wantInt(t, dst, 2, "new")
	sh.round()
	wantInt(t, dst, 2, "new")
	wantInt(t, dst, 100, "filler")
	requireSame(t, src, dst, "after the round")
	if got := s.Metrics().DeletesDropped; got != 1 {
		t.Fatalf("%d deletes dropped, want 1", got)
	}
	sh.finish(src)
}

// A key deleted behind and inserted again behind, in another slot: the
// new slot is dirty and ships the row; the old key's delete is dropped or
// shipped first, either way the row survives.
func TestTrapDeleteBehindReinsertBehindElsewhere(t *testing.T) {
	src, dst, _, sh := trapSetup(t)
	tab := src.TableByName(tabInts)
	for _, id := range []int64{1, 3} {
		if err := tab.Delete(intSlot(t, src, id)); err != nil {
			t.Fatal(err)
		}
	}
	if got := mustInsert(t, src, tabInts, intRow(1, "moved")); got != 3 {
		t.Fatalf("row 1 went to slot %d, want 3 (behind, freed last)", got)
	}
	sh.drain()
	wantInt(t, dst, 1, "old") // the snapshot did not pass slot 1 or 3 again
	sh.round()
	wantInt(t, dst, 1, "moved")
	wantInt(t, dst, 3, "")
	sh.finish(src)
}

// A primary key change of a slot behind the cursor arrives as a delete of
// the old key and an insert of the slot: the old key goes, the new one
// comes. Keys also trade places between two slots behind.
func TestTrapPKUpdateBehind(t *testing.T) {
	src, dst, s, sh := trapSetup(t)
	tab := src.TableByName(tabInts)
	mustUpdate := func(id int64, row int64, v string) {
		t.Helper()
		if err := tab.Update(intSlot(t, src, id), intRow(row, v)); err != nil {
			t.Fatal(err)
		}
	}
	mustUpdate(1, 50, "renamed") // behind: delete 1 logged, slot 1 dirty
	mustUpdate(2, 70, "was-2")   // behind: delete 2 logged, slot 2 dirty
	mustUpdate(4, 2, "was-4")    // behind: delete 4 logged, slot 4 dirty, key 2 live again
	mustUpdate(8, 60, "ahead")   // ahead: nothing logged, the cursor reads it
	if got, want := s.LogBytes(), 3*(2+keyEntryOverheadBytes)+3*dirtyEntryBytes; got != want {
		t.Fatalf("log holds %d bytes, want %d (three 2-byte keys, three slots)", got, want)
	}
	sh.drain()
	sh.round()
	for id, want := range map[int64]string{1: "", 50: "renamed", 70: "was-2", 2: "was-4", 4: "", 8: "", 60: "ahead"} {
		wantInt(t, dst, id, want)
	}
	if got := s.Metrics().DeletesDropped; got != 1 {
		t.Fatalf("%d deletes dropped, want 1 (key 2)", got)
	}
	sh.finish(src)
}

// The delete of a row inserted behind the cursor after S reaches a
// destination that never had the row: applying it is harmless. Both
// within one log and across rounds.
func TestTrapDeleteOfRowInsertedBehind(t *testing.T) {
	src, dst, s, sh := trapSetup(t)
	tab := src.TableByName(tabInts)
	if err := tab.Delete(intSlot(t, src, 0)); err != nil {
		t.Fatal(err)
	}
	if got := mustInsert(t, src, tabInts, intRow(77, "short-lived")); got != 0 {
		t.Fatalf("row 77 went to slot %d, want 0 (behind)", got)
	}
	if err := tab.Delete(0); err != nil {
		t.Fatal(err)
	}
	sh.drain()
	sh.round()
	m := s.Metrics()
	if m.Deletes.Rows != 2 || m.UpsertsGone != 1 {
		t.Fatalf("shipped %d deletes with %d gone upserts, want 2 and 1", m.Deletes.Rows, m.UpsertsGone)
	}
	wantInt(t, dst, 77, "")
	wantInt(t, dst, 0, "")

	// Across rounds: the row ships in one round, its delete in the next.
	mustInsert(t, src, tabInts, intRow(88, "next-round"))
	sh.round()
	wantInt(t, dst, 88, "next-round")
	if err := tab.Delete(intSlot(t, src, 88)); err != nil {
		t.Fatal(err)
	}
	sh.round()
	wantInt(t, dst, 88, "")

	// Applying a delete for a key the destination never had is no error.
	if err := Apply(dst, deleteBlock(1, intKey(12345))); err != nil {
		t.Fatalf("delete of a missing key: %v", err)
	}
	sh.finish(src)
}

// A slot shipped in round N and changed again before round N+1 ships
// again with its latest content; a slot changed during the round before
// its block is cut ships the newer row at once, and again next round.
func TestTrapSlotChangedAcrossRounds(t *testing.T) {
	src, dst, s, sh := trapSetup(t)
	tab := src.TableByName(tabInts)
	sh.drain()
	set := func(v string) {
		t.Helper()
		if err := tab.Update(intSlot(t, src, 3), intRow(3, v)); err != nil {
			t.Fatal(err)
		}
	}
	set("v1")
	set("v1-bigger-than-before") // still one entry in the dirty set
	if got := s.LogBytes(); got != dirtyEntryBytes {
		t.Fatalf("log holds %d bytes after two updates of one slot, want %d", got, dirtyEntryBytes)
	}
	sh.round()
	wantInt(t, dst, 3, "v1-bigger-than-before")
	set("v2")
	sh.round()
	wantInt(t, dst, 3, "v2")

	set("v3")
	if err := s.StartRound(); err != nil {
		t.Fatal(err)
	}
	set("v4") // after the swap, before the block is cut
	sh.drain()
	wantInt(t, dst, 3, "v4")
	if got := s.LogBytes(); got != dirtyEntryBytes {
		t.Fatalf("log holds %d bytes after the round, want the slot again (%d)", got, dirtyEntryBytes)
	}
	sh.round()
	wantInt(t, dst, 3, "v4")
	sh.finish(src)
}
