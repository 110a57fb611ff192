package load

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/wire"
)

// loadBatchRows is the rows one UpsertMany of Load carries; UpsertMany
// splits them by partition into calls of at most client.UpsertManyRowsMax.
const loadBatchRows = 8192

// loadBatchRowsMax bounds LoadBatches's batches, which it holds in memory.
const loadBatchRowsMax = 1 << 20

// LoadReport is a bulk load's figures.
type LoadReport struct {
	Rows       int
	Seconds    float64
	RowsPerSec float64
}

// Load upserts rows 0..rows-1 (Key(i, keyBytes), Value(i, 0, valueBytes))
// into table through UpsertMany. On error some rows may have been
// written; loading again is harmless (upserts).
func Load(ctx context.Context, c *client.Client, table string, rows, keyBytes, valueBytes int) (LoadReport, error) {
	return LoadBatches(ctx, c, table, rows, keyBytes, valueBytes, loadBatchRows, nil)
}

// LoadProgress is Load calling done, if not nil, after each batch with
// the rows loaded so far.
func LoadProgress(ctx context.Context, c *client.Client, table string, rows, keyBytes, valueBytes int, done func(rows int)) (LoadReport, error) {
	var each func(int, time.Duration)
	if done != nil {
		each = func(n int, _ time.Duration) { done(n) }
	}
	return LoadBatches(ctx, c, table, rows, keyBytes, valueBytes, loadBatchRows, each)
}

// LoadBatches is Load in batches of batchRows rows (at most
// loadBatchRowsMax), calling done, if not nil, after each batch with the
// rows loaded so far and the batch's time.
func LoadBatches(ctx context.Context, c *client.Client, table string, rows, keyBytes, valueBytes, batchRows int, done func(rows int, took time.Duration)) (LoadReport, error) {
	switch {
	case keyBytes < KeyBytesMin:
		return LoadReport{}, fmt.Errorf("load: keys of %d bytes, at least %d", keyBytes, KeyBytesMin)
	case batchRows < 1 || batchRows > loadBatchRowsMax:
		return LoadReport{}, fmt.Errorf("load: batches of %d rows, want 1..%d", batchRows, loadBatchRowsMax)
	}
	start := time.Now()
	batch := make([][]wire.Value, 0, batchRows)
	loaded := 0
	for i := 0; i < rows; {
		batch = batch[:0]
		for ; i < rows && len(batch) < batchRows; i++ {
			u := uint64(i)
			batch = append(batch, []wire.Value{wire.Bytes(Key(u, keyBytes)), wire.Bytes(Value(u, 0, valueBytes))})
		}
		t0 := time.Now()
		if err := c.UpsertMany(ctx, table, batch); err != nil {
			return report(loaded, start), fmt.Errorf("load: rows %d..%d: %w", loaded, i-1, err)
		}
		loaded = i
		if done != nil {
			done(loaded, time.Since(t0))
		}
	}
	return report(loaded, start), nil
}

func report(rows int, start time.Time) LoadReport {
	r := LoadReport{Rows: rows, Seconds: time.Since(start).Seconds()}
	if r.Seconds > 0 {
		r.RowsPerSec = float64(rows) / r.Seconds
	}
	return r
}

// VerifyResult is what Verify found.
type VerifyResult struct {
	// Checked keys: every key of Report.Acked.
	Checked int
	// Lost: an acknowledged key whose row is missing or holds a value
	// neither its acknowledged write nor one of its uncertain writes put.
	Lost int
	// Examples describes up to 10 lost keys.
	Examples []string
}

// Verify reads back every acknowledged key r recorded (Config.Record) and
// checks that it holds its last acknowledged value, or the value of one
// of its uncertain writes (which may have happened after it). A key with
// only uncertain writes is not checked: it may hold any of them, or what
// it held before the writer began, which the report does not know.
// It fails on a read that fails for another reason than a missing row.
func Verify(ctx context.Context, c *client.Client, table string, r Report) (VerifyResult, error) {
	return VerifyProgress(ctx, c, table, r, nil)
}

// VerifyProgress is Verify calling done, if not nil, with the keys read
// so far of how many, as each is read: from the reading goroutines, so
// it must be safe for concurrent use.
func VerifyProgress(ctx context.Context, c *client.Client, table string, r Report, done func(read, of int)) (VerifyResult, error) {
	var read atomic.Int64
	keys := make([]string, 0, len(r.Acked))
	for k := range r.Acked {
		keys = append(keys, k)
	}
	var (
		mu   sync.Mutex
		res  = VerifyResult{Checked: len(keys)}
		sem  = make(chan struct{}, 32)
		wg   sync.WaitGroup
		errs []error
	)
	lost := func(k string, why string) {
		mu.Lock()
		defer mu.Unlock()
		res.Lost++
		if len(res.Examples) < 10 {
			if id, ok := r.AckedID[k]; ok {
				why = fmt.Sprintf("acknowledged as txn %v, %s", id, why)
			}
			res.Examples = append(res.Examples, fmt.Sprintf("key %x: %s", k, why))
		}
	}
	for _, k := range keys {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return res, ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			row, err := readRetry(ctx, c, table, []byte(k))
			if done != nil {
				done(int(read.Add(1)), len(keys))
			}
			want, acked := r.Acked[k]
			switch {
			case errors.Is(err, client.ErrNotFound):
				// The row is missing.
				if acked {
					lost(k, "missing: "+err.Error())
				}
				return
			case err != nil:
				mu.Lock()
				errs = append(errs, fmt.Errorf("key %x: %w", k, err))
				mu.Unlock()
				return
			case len(row) != 2 || row[1].Type != wire.TypeBytes:
				lost(k, fmt.Sprintf("row %v", row))
				return
			}
			got := row[1].Bytes
			if acked && string(got) == string(want) {
				return
			}
			for _, m := range r.Maybe[k] {
				if string(got) == string(m) {
					return
				}
			}
			lost(k, fmt.Sprintf("holds %x, acknowledged %x", got, want))
		})
	}
	wg.Wait()
	return res, errors.Join(errs...)
}

// verifyReadAttempts bounds the reads of one key, and verifyReadPause
// the wait before the next, doubled each time: a read is safe to repeat
// when its connection broke (uncertain), no node answered, or the node
// refused it without running it (its registration lost for a moment, a
// replica between states). Only a missing row (ErrNotFound) is an answer
// about the key: read as a lost write, a refusal made a loaded run report
// acknowledged writes lost that were there.
const (
	verifyReadAttempts = 8
	verifyReadPause    = 50 * time.Millisecond
)

func readRetry(ctx context.Context, c *client.Client, table string, key []byte) ([]wire.Value, error) {
	var err error
	pause := verifyReadPause
	for i := range verifyReadAttempts {
		var row []wire.Value
		row, err = c.Read(ctx, table, wire.Bytes(key))
		again := errors.Is(err, client.ErrUncertain) || errors.Is(err, client.ErrNoNode) || errors.Is(err, client.ErrRefused) ||
			(errors.Is(err, client.ErrProcedure) && !errors.Is(err, client.ErrNotFound))
		if !again || ctx.Err() != nil || i == verifyReadAttempts-1 {
			return row, err
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
		pause *= 2
	}
	return nil, err
}
