package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// testConfig is a small run: 20k rows in blocks of 8 KiB under a window of
// 4, so the snapshot takes dozens of round trips and the writer's upserts
// land behind the cursor, with short measuring windows.
func testConfig(writer bool) RejoinConfig {
	return RejoinConfig{
		Rows:             20_000,
		Writer:           writer,
		WriterTxnsPerSec: 20_000,
		Warmup:           20 * time.Millisecond,
		BeforeWindow:     200 * time.Millisecond,
		BlockBytesMax:    8 << 10,
		WindowBlocksMax:  4,
		Timeout:          time.Minute,
		Seed:             7,
	}
}

func TestRunRejoin(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct {
		name   string
		writer bool
		codec  wire.Codec
	}{
		{"writer=none", false, wire.CodecNone},
		{"writer=on", true, wire.CodecNone},
		{"writer=on/codec=s2", true, wire.CodecS2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(tc.writer)
			cfg.Codec = tc.codec
			res, err := RunRejoin(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", res)
			checkResult(t, cfg, res)
		})
	}
}

func checkResult(t *testing.T, cfg RejoinConfig, res RejoinResult) {
	t.Helper()
	positive := map[string]float64{
		"Rows":         float64(res.Rows),
		"StreamedRows": float64(res.StreamedRows),
		"SnapshotRows": float64(res.SnapshotRows),
		"Bytes":        float64(res.Bytes),
		"WireBytes":    float64(res.WireBytes),
		"Blocks":       float64(res.Blocks),
		"Seconds":      res.Seconds,
		"RowsPerSec":   res.RowsPerSec,
		"MBPerSec":     res.MBPerSec,
		"Rounds":       float64(res.Rounds),
		"HandoffPause": float64(res.HandoffPause),
		"CommonTxnID":  float64(res.CommonTxnID),
		"Digest":       float64(res.Digest),
		"FinalRows":    float64(res.FinalRows),
	}
	if cfg.Writer {
		positive["WritesBeforePerSec"] = res.WritesBeforePerSec
		positive["WritesDuringPerSec"] = res.WritesDuringPerSec
		positive["WriteRatio"] = res.WriteRatio
		positive["WriterOfferedPerSec"] = res.WriterOfferedPerSec
		positive["TxnsBuffered+TxnsDropped+TxnsLate"] = float64(res.TxnsBuffered + res.TxnsDropped + res.TxnsLate)
	}
	for name, v := range positive {
		if !(v > 0) {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	// Every row reaches the destination by the snapshot or a catch-up
	// round; a writer adds rows, never removes any.
	if res.SnapshotRows < int64(cfg.Rows) || res.Rows < cfg.Rows || res.FinalRows < res.Rows {
		t.Errorf("rows: %d in the snapshot, %d live, %d at the end; the source had %d", res.SnapshotRows, res.Rows, res.FinalRows, cfg.Rows)
	}
	if res.StreamedRows != res.SnapshotRows+res.CatchUpRows {
		t.Errorf("streamed %d rows, snapshot %d + catch-up %d", res.StreamedRows, res.SnapshotRows, res.CatchUpRows)
	}
	// A stored row is its key and value plus a few bytes of headers.
	if perRow := float64(res.Bytes) / float64(res.StreamedRows); perRow < 116 || perRow > 126 {
		t.Errorf("%.1f tuple bytes per row, want 116..126", perRow)
	}
	if cfg.Codec == wire.CodecNone && res.WireBytes < res.Bytes {
		t.Errorf("uncompressed: %d wire bytes for %d tuple bytes", res.WireBytes, res.Bytes)
	}
	if cfg.Codec == wire.CodecS2 && res.WireBytes > res.Bytes*3/4 {
		t.Errorf("s2: %d wire bytes for %d tuple bytes, want under 75%%", res.WireBytes, res.Bytes)
	}
	if !cfg.Writer {
		if res.CatchUpRows != 0 || res.FinalRows != cfg.Rows || res.WriteRatio != 0 {
			t.Errorf("no writer: %d catch-up rows, %d final rows, write ratio %v", res.CatchUpRows, res.FinalRows, res.WriteRatio)
		}
	}
	if res.HandoffPause > 10*time.Second || res.Seconds > 30 {
		t.Errorf("handoff pause %v, rejoin %.1fs", res.HandoffPause, res.Seconds)
	}
}

// TestRunRejoinErrors: a bad config is refused before anything starts, a
// context that ends stops the run with its error and leaves nothing
// running, and a Rejoin runs only once.
func TestRunRejoinErrors(t *testing.T) {
	defer goleak.VerifyNone(t)
	if _, err := RunRejoin(context.Background(), RejoinConfig{}); err == nil || !strings.Contains(err.Error(), "Rows") {
		t.Fatalf("zero rows: %v", err)
	}
	if _, err := RunRejoin(context.Background(), RejoinConfig{Rows: 1, KeyBytes: 4}); err == nil {
		t.Fatal("4-byte keys accepted")
	}

	cfg := testConfig(true)
	cfg.BeforeWindow = time.Hour // cancelled long before
	r, err := NewRejoin(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := r.Run(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled run: %v, want DeadlineExceeded", err)
	}
	if _, err := r.Run(context.Background()); !errors.Is(err, errRunOnce) {
		t.Fatalf("second run: %v", err)
	}

	// A replica that differs after the handoff fails the final check.
	cfg = testConfig(false)
	cfg.Rows = 2000
	if r, err = NewRejoin(cfg); err != nil {
		t.Fatal(err)
	}
	r.onLive = func(p *partition.Partition) {
		tab := p.TableByName(kvTable)
		slot, ok := tab.LookupValues([]wire.Value{wire.Bytes(r.shape.key(nil, 1))})
		if !ok {
			panic("row 1 missing at the destination")
		}
		if err := tab.Delete(slot); err != nil {
			panic(err)
		}
	}
	_, err = r.Run(context.Background())
	t.Log(err)
	if err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("replicas made to differ: %v, want a digest mismatch", err)
	}
}
