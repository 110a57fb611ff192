package cow

import (
	"errors"
	"testing"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"BlockBytesMax 0":                    func(c *Config) { c.BlockBytesMax = 0 },
		"BlockBytesMax over a frame":         func(c *Config) { c.BlockBytesMax = BlockBytesLimit + 1 },
		"ChangeLogBytesMax 0":                func(c *Config) { c.ChangeLogBytesMax = 0 },
		"ChangeLogBytesMax over the limit":   func(c *Config) { c.ChangeLogBytesMax = ChangeLogBytesLimit + 1 },
		"ChangeLogTxnBytesMax 0":             func(c *Config) { c.ChangeLogTxnBytesMax = 0 },
		"ChangeLogTxnBytesMax = the log":     func(c *Config) { c.ChangeLogTxnBytesMax = c.ChangeLogBytesMax },
		"PaceLowWaterBytes negative":         func(c *Config) { c.PaceLowWaterBytes = -1 },
		"PaceLowWaterBytes above the hold":   func(c *Config) { c.PaceLowWaterBytes = c.ChangeLogBytesMax - c.ChangeLogTxnBytesMax + 1 },
		"ThrottleWindowTicks 0":              func(c *Config) { c.ThrottleWindowTicks = 0 },
		"ThrottleWindowTicks over the limit": func(c *Config) { c.ThrottleWindowTicks = ThrottleWindowTicksLimit + 1 },
		"PaceTxnsPerTick 0":                  func(c *Config) { c.PaceTxnsPerTick = 0 },
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: Validate() = %v, want ErrConfig", name, err)
		}
		p := newTestPartition(t)
		if s, err := Activate(p, c); !errors.Is(err, ErrConfig) || s != nil {
			t.Errorf("%s: Activate() = %v, %v, want ErrConfig", name, s, err)
		}
	}
	if _, err := Activate(nil, DefaultConfig()); !errors.Is(err, ErrConfig) {
		t.Errorf("Activate(nil) = %v, want ErrConfig", err)
	}
}

func TestPhaseRules(t *testing.T) {
	src, dst := newTestPartition(t), newTestPartition(t)
	mustInsert(t, src, tabInts, intRow(1, "a"))
	s, sh := activate(t, src, dst, testConfig())
	if s.Phase() != PhaseSnapshot {
		t.Fatalf("phase %v after Activate", s.Phase())
	}
	for name, f := range map[string]func() error{"StartRound": s.StartRound, "FinalDelta": s.FinalDelta} {
		if err := f(); !errors.Is(err, ErrPhase) {
			t.Fatalf("%s during the snapshot: %v, want ErrPhase", name, err)
		}
	}
	sh.drain()
	if s.Phase() != PhaseBetweenRounds {
		t.Fatalf("phase %v after the snapshot", s.Phase())
	}
	if b, ok := s.NextBlock(nil); ok {
		t.Fatalf("between rounds NextBlock returned %+v", b)
	}
	if err := s.StartRound(); err != nil {
		t.Fatal(err)
	}
	if s.Phase() != PhaseRound {
		t.Fatalf("phase %v after StartRound", s.Phase())
	}
	if err := s.StartRound(); !errors.Is(err, ErrPhase) {
		t.Fatalf("StartRound during a round: %v", err)
	}
	if err := s.FinalDelta(); !errors.Is(err, ErrPhase) {
		t.Fatalf("FinalDelta during a round: %v", err)
	}
	sh.drain() // an empty round
	if err := s.FinalDelta(); err != nil {
		t.Fatal(err)
	}
	if err := s.StartRound(); !errors.Is(err, ErrPhase) {
		t.Fatalf("StartRound during the final delta: %v", err)
	}
	sh.drain()
	if s.Phase() != PhaseDone {
		t.Fatalf("phase %v after the final delta", s.Phase())
	}
	if m := s.Metrics(); m.Rounds != 2 || m.Snapshot.Rows != 1 {
		t.Fatalf("metrics %+v", m)
	}
	s.Deactivate()
	for name, f := range map[string]func() error{"StartRound": s.StartRound, "FinalDelta": s.FinalDelta} {
		if err := f(); !errors.Is(err, ErrPhase) {
			t.Fatalf("%s after Deactivate: %v, want ErrPhase", name, err)
		}
	}
	requireSame(t, src, dst, "after the handoff")
}

// A change ahead of the cursor costs nothing; behind it, a slot costs
// dirtyEntryBytes once however often it changes, and a delete its key's
// bytes plus keyEntryOverheadBytes.
func TestLogAccounting(t *testing.T) {
	src, dst := newTestPartition(t), newTestPartition(t)
	for i := range int64(6) {
		mustInsert(t, src, tabInts, intRow(i, "x"))
	}
	pairSlot := mustInsert(t, src, tabPairs, pairRow("eu", 1, "p", 0))
	s, sh := activate(t, src, dst, testConfig())
	sh.blocks(3) // ints slots 0..2 behind
	tab := src.TableByName(tabInts)
	for range 3 {
		if err := tab.Update(4, intRow(4, "ahead")); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.TableByName(tabPairs).Update(pairSlot, pairRow("eu", 1, "later table", 5)); err != nil {
		t.Fatal(err)
	}
	if n := s.LogBytes(); n != 0 {
		t.Fatalf("changes ahead of the cursor logged %d bytes", n)
	}
	for range 3 {
		if err := tab.Update(1, intRow(1, "behind")); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.LogBytes(); n != dirtyEntryBytes {
		t.Fatalf("three updates of one slot behind logged %d bytes, want %d", n, dirtyEntryBytes)
	}
	if err := tab.Delete(2); err != nil {
		t.Fatal(err)
	}
	want := dirtyEntryBytes + len(intKey(2)) + keyEntryOverheadBytes
	if n := s.LogBytes(); n != want {
		t.Fatalf("log %d bytes after a delete, want %d", n, want)
	}
	if m := s.Metrics(); m.Changes != 8 || m.LogBytesPeak != want {
		t.Fatalf("metrics %+v, want 8 changes, peak %d", m, want)
	}
	sh.finish(src)
}

// A finished table is behind everywhere, slots it gains later included,
// and the snapshot walks slots a table gains ahead of the cursor.
func TestSnapshotCursorAtTheEdges(t *testing.T) {
	src, dst := newTestPartition(t), newTestPartition(t)
	for i := range int64(3) {
		mustInsert(t, src, tabInts, intRow(i, "x"))
	}
	mustInsert(t, src, tabBlobs, blobRow(1, "b"))
	s, sh := activate(t, src, dst, testConfig())
	sh.blocks(3)
	mustInsert(t, src, tabInts, intRow(3, "new, ahead")) // slot 3: the cursor reads it
	if n := s.LogBytes(); n != 0 {
		t.Fatalf("an insert at the cursor logged %d bytes", n)
	}
	sh.blocks(2) // slot 3, then the blobs row: the ints table is finished
	if s.snapTable != 1 {
		t.Fatalf("cursor at table index %d, want 1", s.snapTable)
	}
	mustInsert(t, src, tabInts, intRow(4, "new, beyond the old end")) // slot 4 of a finished table
	if n := s.LogBytes(); n != dirtyEntryBytes {
		t.Fatalf("an insert into a finished table logged %d bytes, want %d", n, dirtyEntryBytes)
	}
	sh.drain()
	mustInsert(t, src, tabPairs, pairRow("us", 2, "after the snapshot", 1))
	sh.round()
	sh.finish(src)
}

// NextBlock appends to dst, and the array header takes each of its three
// sizes: fixarray under 16 tuples, array16, and array32 from 65536.
func TestBlockShapes(t *testing.T) {
	p := partition.New()
	tab, err := p.CreateTable(partition.Schema{Name: "k", Columns: []partition.Column{{Name: "k", Type: wire.TypeInt64}}, Key: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	const rows = 70_000
	for i := range int64(rows) {
		if _, err := tab.Insert([]wire.Value{wire.Int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		blockBytes, hdr int
	}{{1, 1}, {2 * 15, 1}, {3 * 100, 3}, {4 << 20, 5}} {
		cfg := testConfig()
		cfg.BlockBytesMax = c.blockBytes
		s, err := Activate(p, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// Room enough that the block is appended in place, behind a prefix
		// that must survive.
		buf := append(make([]byte, 0, 1<<20), "prefix"...)
		b, ok := s.NextBlock(buf)
		if !ok {
			t.Fatal("no block")
		}
		if err := wire.ScanTuples(b.Tuples, int(b.Count)); err != nil {
			t.Fatalf("BlockBytesMax %d: %v", c.blockBytes, err)
		}
		if got := len(wire.AppendArrayHeader(nil, int(b.Count))); got != c.hdr {
			t.Fatalf("BlockBytesMax %d: %d tuples, header of %d bytes, want %d", c.blockBytes, b.Count, got, c.hdr)
		}
		if &buf[:len(buf)+1][len(buf)] != &b.Tuples[0] || string(buf) != "prefix" {
			t.Fatalf("BlockBytesMax %d: the block is not appended to dst behind its content", c.blockBytes)
		}
		dst := partition.New()
		if _, err := dst.CreateTable(tab.Schema()); err != nil {
			t.Fatal(err)
		}
		if err := Apply(dst, b); err != nil {
			t.Fatal(err)
		}
		if dst.Table(1).Len() != int(b.Count) {
			t.Fatalf("applied %d rows of %d", dst.Table(1).Len(), b.Count)
		}
		s.Deactivate()
	}
}
