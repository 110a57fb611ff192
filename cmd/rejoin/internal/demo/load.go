package demo

import (
	"context"
	"fmt"
	"time"

	"github.com/rejoin-db/rejoin/bench/load"
	"github.com/rejoin-db/rejoin/recovery/client"
)

// The demo's rows: table kv (layout.KV), keys of 16 bytes; half the
// writer's writes update loaded rows, half insert new ones.
const (
	table          = "kv"
	keyBytes       = 16
	newKeyFraction = 0.5
)

// bulkLoad loads rows 0..rows-1 through c (bench/load's bulk loader).
func bulkLoad(ctx context.Context, c *client.Client, rows, valueBytes int, progress func(rows int)) (float64, error) {
	rep, err := load.LoadProgress(ctx, c, table, rows, keyBytes, valueBytes, progress)
	if err != nil {
		return 0, err
	}
	return rep.RowsPerSec, nil
}

// WindowStats are the writer's figures over one phase.
type WindowStats struct {
	Writes, Errors, Uncertain int64
	// Missed: offers of a fixed-rate writer that found every caller busy
	// (load.Window.Missed); they are not queued, so they count against
	// the served rate.
	Missed          int64
	Seconds, PerSec float64
	P99             time.Duration
}

// writer is bench/load's generator, measured phase by phase: Phase
// closes the current window and opens the next. Against a rejoin cluster
// it records every acknowledged write, to read them back.
type writer struct {
	g      *load.Generator
	last   load.Snapshot
	report *load.Report
}

// startWriter starts the writer through put; record keeps the
// acknowledged writes, which needs put's txn IDs.
func startWriter(ctx context.Context, put load.Put, record bool, rows, valueBytes, rate, callers int) (*writer, error) {
	g, err := load.StartPut(ctx, put, load.Config{Table: table, Rate: float64(rate), Concurrency: callers,
		KeyBytes: keyBytes, ValueBytes: valueBytes, Keys: rows, NewKeyFraction: newKeyFraction, Record: record})
	if err != nil {
		return nil, err
	}
	return &writer{g: g, last: g.Snapshot()}, nil
}

// Phase closes the current window and returns its figures.
func (w *writer) Phase() WindowStats {
	sn := w.g.Snapshot()
	win := sn.Since(w.last)
	w.last = sn
	return WindowStats{Writes: win.Txns, Errors: win.Errors, Uncertain: win.Uncertain, Missed: win.Missed, Seconds: win.Seconds,
		PerSec: win.TxnsPerSec, P99: time.Duration(win.P99 * float64(time.Millisecond))}
}

// Stop ends the writer and keeps its report (the acknowledged writes).
func (w *writer) Stop() {
	if w.report == nil {
		r := w.g.Stop()
		w.report = &r
	}
}

// LastError is the text of the last failed or uncertain write.
func (w *writer) LastError() string {
	if w.report != nil {
		return w.report.LastError
	}
	return "(writer running)"
}

// CheckAcked reads every recorded write back through c (load.Verify).
// Call after Stop.
func (w *writer) CheckAcked(ctx context.Context, c *client.Client, progress func(read, of int)) (checked, lost int, examples []string, err error) {
	if w.report == nil {
		return 0, 0, nil, fmt.Errorf("demo: writer not stopped")
	}
	res, err := load.VerifyProgress(ctx, c, table, *w.report, progress)
	return res.Checked, res.Lost, res.Examples, err
}
