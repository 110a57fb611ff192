package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/rejoin-db/rejoin/bench/load"
	"github.com/rejoin-db/rejoin/recovery/client"
)

const loadUsage = `usage: rejoin load --etcd ENDPOINTS --rows N [--rate R] [--writers W] [--batch B] [--json]

Writes N rows into table kv of a running cluster, one upsert per row and
per transaction: rows 0..N-1 of bench/load's shape (--key-bytes keys,
--value-bytes values; a row that is there is replaced), at an offered
rate of R writes per second (0: as fast as W callers go), through every
live node. A progress bar runs on a terminal. At the end it prints the
writes acknowledged, failed and uncertain, the throughput, and the
latency percentiles of the acknowledged writes (--json: one object).
Exit status 1 if a write failed, 3 if one is uncertain (sent, not
answered: it may or may not have happened).

With --batch B it bulk-loads instead: the same rows, B at a time, each
batch split by partition into upsert_many transactions of at most 256
rows that run at once; no rate, and the latencies are the batches'.

flags:
`

// loadResult is what `rejoin load --json` prints. Written, Failed and
// Uncertain count writes, except that with --batch Written counts rows
// and Failed and Uncertain the batch that ended the load.
type loadResult struct {
	// BatchRows is --batch: 0 for one write per row.
	BatchRows int     `json:"batch_rows"`
	Rows      int64   `json:"rows"`
	Written   int64   `json:"written"`
	Failed    int64   `json:"failed"`
	Uncertain int64   `json:"uncertain"`
	Missed    int64   `json:"missed_offers"`
	Seconds   float64 `json:"seconds"`
	PerSec    float64 `json:"writes_per_sec"`
	Rate      float64 `json:"offered_rate"`
	Writers   int     `json:"writers"`
	P50Ms     float64 `json:"p50_ms"`
	P90Ms     float64 `json:"p90_ms"`
	P99Ms     float64 `json:"p99_ms"`
	P999Ms    float64 `json:"p999_ms"`
	MaxMs     float64 `json:"max_ms"`
	LastError string  `json:"last_error,omitempty"`
}

func runLoad(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("load", stderr)
	etcd := newEtcdFlags(fs)
	nodeTLS := newClientTLSFlags(fs, etcd)
	rows := fs.Int64("rows", 100_000, "rows to write, one transaction each")
	rate := fs.Float64("rate", 0, "offered writes per second (0: as fast as the writers go)")
	writers := fs.Int("writers", 16, "concurrent callers, each waiting for its write's answer before the next")
	keyBytes := fs.Int("key-bytes", 16, "bytes of each key")
	valueBytes := fs.Int("value-bytes", 100, "bytes of each value")
	batch := fs.Int("batch", 0, "bulk-load in batches of this many `rows` (0: one write per row, at --rate)")
	asJSON := fs.Bool("json", false, "print one JSON object, no progress bar")
	timeout := fs.Duration("timeout", 10*time.Second, "bound of reaching etcd, and of each write")
	fs.Usage = func() {
		fmt.Fprint(stderr, loadUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, "load", args, stderr); err != nil {
		return err
	}
	var bad string
	switch {
	case *rows < 1:
		bad = fmt.Sprintf("--rows %d: want at least 1", *rows)
	case *rate < 0:
		bad = fmt.Sprintf("--rate %v: want >= 0", *rate)
	case *writers < 1 || *writers > 4096:
		bad = fmt.Sprintf("--writers %d: want 1..4096", *writers)
	case *keyBytes < load.KeyBytesMin || *valueBytes < 0:
		bad = fmt.Sprintf("--key-bytes %d, --value-bytes %d: want keys of at least %d bytes", *keyBytes, *valueBytes, load.KeyBytesMin)
	case *timeout <= 0:
		bad = fmt.Sprintf("--timeout %s: want > 0", *timeout)
	case *batch < 0 || *batch > 1<<20:
		bad = fmt.Sprintf("--batch %d: want 0..%d", *batch, 1<<20)
	case *batch > 0 && *rate > 0:
		bad = "--batch loads as fast as it goes: no --rate"
	}
	if bad != "" {
		fmt.Fprintf(stderr, "rejoin load: %s\n", bad)
		return errUsage
	}
	creds, err := nodeTLS.load()
	if err != nil {
		fmt.Fprintf(stderr, "rejoin load: %v\n", err)
		return errUsage
	}
	cli, ctx, done, err := openEtcd("load", etcd, *timeout, stderr)
	if err != nil {
		return err
	}
	defer done()
	s := &shell{name: "load", flags: &shellFlags{etcd: etcd, nodeTLS: nodeTLS, timeout: *timeout}, ctx: ctx}
	c, err := client.Open(ctx, cli, client.Options{Timeout: *timeout, TLS: creds})
	if err != nil {
		return s.clusterErr(err)
	}
	defer c.Close()
	if len(c.Nodes()) == 0 {
		return s.clusterErr(fmt.Errorf("%w: none registered in etcd", client.ErrNoNode))
	}
	// The writes run past --timeout: it bounds each one, not the run.
	runCtx, stop := signalContext()
	defer stop()
	var bar *loadBar
	if !*asJSON && isTerminalWriter(stderr) {
		label := "writes "
		if *batch > 0 {
			label = "rows "
		}
		bar = newLoadBar(stderr, label, *rows)
	}
	if *batch > 0 {
		res, err := bulkLoad(runCtx, c, int(*rows), *keyBytes, *valueBytes, *batch, bar)
		if perr := printLoad(stdout, res, *asJSON); perr != nil {
			return perr
		}
		return err
	}
	g, err := load.Start(runCtx, c, load.Config{Table: "kv", Writes: *rows, Rate: *rate, Concurrency: *writers,
		KeyBytes: *keyBytes, ValueBytes: *valueBytes, NewKeyFraction: 1})
	if err != nil {
		fmt.Fprintf(stderr, "rejoin load: %v\n", err)
		return errUsage
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case <-g.Done():
			waiting = false
		case <-tick.C:
		}
		if bar != nil {
			bar.update(g.Snapshot())
		}
	}
	if bar != nil {
		bar.finish()
	}
	rep, werr := g.Wait()
	res := loadResult{Rows: *rows, Written: rep.Txns, Failed: rep.Errors, Uncertain: rep.Uncertain, Missed: rep.Missed,
		Seconds: rep.Seconds, PerSec: rep.TxnsPerSec, Rate: *rate, Writers: *writers,
		P50Ms: rep.P50, P90Ms: rep.P90, P99Ms: rep.P99, P999Ms: rep.P999, MaxMs: rep.Max, LastError: rep.LastError}
	if err := printLoad(stdout, res, *asJSON); err != nil {
		return err
	}
	switch {
	case werr != nil:
		return werr
	case runCtx.Err() != nil:
		return fmt.Errorf("interrupted after %d writes", res.Written+res.Failed+res.Uncertain)
	case res.Uncertain > 0:
		return &exitError{exitUncertain, fmt.Errorf("%d writes uncertain (sent, not answered: each may or may not have happened); last: %s", res.Uncertain, res.LastError)}
	case res.Failed > 0:
		return fmt.Errorf("%d writes failed (not written); last: %s", res.Failed, res.LastError)
	}
	return nil
}

// printLoad prints what a load did.
func printLoad(w io.Writer, res loadResult, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	if res.BatchRows > 0 {
		fmt.Fprintf(w, "loaded %d of %d rows in %.2f s: %.0f rows/s, in batches of %d rows\n",
			res.Written, res.Rows, res.Seconds, res.PerSec, res.BatchRows)
		fmt.Fprintf(w, "batch latency  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms\n", res.P50Ms, res.P90Ms, res.P99Ms, res.MaxMs)
		return nil
	}
	fmt.Fprintf(w, "wrote %d of %d rows in %.2f s: %.0f writes/s (offered: %s, %d writers)\n",
		res.Written, res.Rows, res.Seconds, res.PerSec, rateText(res.Rate), res.Writers)
	fmt.Fprintf(w, "latency  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  max %.2f ms\n",
		res.P50Ms, res.P90Ms, res.P99Ms, res.P999Ms, res.MaxMs)
	if res.Failed+res.Uncertain+res.Missed > 0 {
		fmt.Fprintf(w, "failed %d, uncertain %d, offers missed (every writer busy) %d\n", res.Failed, res.Uncertain, res.Missed)
	}
	return nil
}

// bulkLoad is --batch: load.LoadBatches with the bar moving after each
// batch. On error the rows of the failed batch may be partly written;
// ErrUncertain among its errors makes the exit status 3.
func bulkLoad(ctx context.Context, c *client.Client, rows, keyBytes, valueBytes, batch int, bar *loadBar) (loadResult, error) {
	var h load.Histogram
	rep, err := load.LoadBatches(ctx, c, "kv", rows, keyBytes, valueBytes, batch, func(n int, took time.Duration) {
		h.Record(took)
		if bar != nil {
			bar.bar.SetCurrent(int64(n))
		}
	})
	if bar != nil {
		bar.finish()
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	res := loadResult{BatchRows: batch, Rows: int64(rows), Written: int64(rep.Rows), Seconds: rep.Seconds, PerSec: rep.RowsPerSec,
		P50Ms: ms(h.Quantile(0.5)), P90Ms: ms(h.Quantile(0.9)), P99Ms: ms(h.Quantile(0.99)), P999Ms: ms(h.Quantile(0.999)), MaxMs: ms(h.Max())}
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, client.ErrUncertain):
		res.Uncertain = 1
		return res, &exitError{exitUncertain, fmt.Errorf("a batch's outcome is uncertain (sent, not answered: its rows may or may not be written): %w", err)}
	}
	res.Failed = 1
	res.LastError = err.Error()
	return res, err
}

// signalContext ends on Ctrl-C or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func rateText(rate float64) string {
	if rate == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%.0f/s", rate)
}

// isTerminalWriter reports whether w is a terminal.
func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}

// loadBar is the progress bar of `rejoin load`: writes answered (rows
// loaded with --batch) out of rows, and the rate and p99 of the last
// interval.
type loadBar struct {
	p    *mpb.Progress
	bar  *mpb.Bar
	last load.Snapshot
	text atomic.Pointer[string] // read by mpb's goroutine
}

func newLoadBar(w io.Writer, label string, rows int64) *loadBar {
	b := &loadBar{p: mpb.New(mpb.WithOutput(w), mpb.WithWidth(60), mpb.WithRefreshRate(150*time.Millisecond), mpb.WithAutoRefresh())}
	b.bar = b.p.AddBar(rows,
		mpb.PrependDecorators(decor.Name(label), decor.CountersNoUnit("%d / %d")),
		mpb.AppendDecorators(decor.Any(func(decor.Statistics) string {
			if t := b.text.Load(); t != nil {
				return *t
			}
			return ""
		}), decor.Percentage(decor.WCSyncSpace)))
	return b
}

// update moves the bar to sn.
func (b *loadBar) update(sn load.Snapshot) {
	if !b.last.At.IsZero() {
		w := sn.Since(b.last)
		t := fmt.Sprintf("%.0f/s p99 %.1f ms", w.TxnsPerSec, w.P99)
		b.text.Store(&t)
	}
	b.last = sn
	b.bar.SetCurrent(sn.Txns + sn.Errors + sn.Uncertain)
}

func (b *loadBar) finish() {
	if !b.bar.Completed() {
		b.bar.Abort(false)
	}
	b.p.Wait()
}
