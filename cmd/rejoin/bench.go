package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/rejoin-db/rejoin/bench"
	"github.com/rejoin-db/rejoin/wire"
)

// runBench runs one in-process rejoin (bench.RunRejoin, the same code as
// BenchmarkRejoinInProcess) and prints what it measured. The flags only
// fill a bench.RejoinConfig.
func runBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", stderr)
	var cfg bench.RejoinConfig
	fs.IntVar(&cfg.Rows, "rows", 1_000_000, "rows in the source partition")
	fs.IntVar(&cfg.ValueBytes, "value-bytes", 100, "bytes of each row's value (keys are 16 bytes)")
	fs.BoolVar(&cfg.Writer, "writer", false, "run a concurrent writer on the source during the rejoin")
	fs.IntVar(&cfg.WriterTxnsPerSec, "write-rate", 100_000, "the writer's offered upserts per second")
	codec := fs.String("codec", "none", "frame compression: none, s2 or zstd")
	fs.IntVar(&cfg.BlockBytesMax, "block-bytes", 0, "tuple bytes per block (0: 256 KiB)")
	fs.IntVar(&cfg.WindowBlocksMax, "window", 0, "unacknowledged blocks at most (0: 16)")
	seed := fs.Uint64("seed", 1, "seed of the rows and the writer's choices")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rejoin bench: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	cfg.Seed = *seed
	switch strings.ToLower(*codec) {
	case "none":
		cfg.Codec = wire.CodecNone
	case "s2":
		cfg.Codec = wire.CodecS2
	case "zstd":
		cfg.Codec = wire.CodecZstd
	default:
		fmt.Fprintf(stderr, "rejoin bench: unknown codec %q (none, s2, zstd)\n", *codec)
		return errUsage
	}
	if err := cfg.WithDefaults().Validate(); err != nil {
		fmt.Fprintf(stderr, "rejoin bench: %v\n", err)
		return errUsage
	}

	// Ctrl-C ends the run cleanly: RunRejoin stops every goroutine it
	// started before it returns.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := bench.RunRejoin(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(benchJSON(res))
	}
	fmt.Fprintf(stdout, "rejoined %d rows in %.3f s: %.0f rows/s, %.1f MB/s (%.1f MB/s on the wire)\n",
		res.Rows, res.Seconds, res.RowsPerSec, res.MBPerSec, res.WireMBPerSec)
	fmt.Fprintf(stdout, "snapshot %d rows, catch-up %d rows in %d rounds, change log peak %d B, handoff pause %v\n",
		res.SnapshotRows, res.CatchUpRows, res.Rounds, res.LogBytesPeak, res.HandoffPause)
	if cfg.Writer {
		fmt.Fprintf(stdout, "writes: %.0f/s before, %.0f/s during (%.1f%%)\n",
			res.WritesBeforePerSec, res.WritesDuringPerSec, 100*res.WriteRatio)
	}
	fmt.Fprintf(stdout, "digests match at %v: %016x over %d rows\n", res.CommonTxnID, res.Digest, res.FinalRows)
	return nil
}

// benchJSON names the figures of a run for --json; every one is measured.
func benchJSON(r bench.RejoinResult) map[string]any {
	return map[string]any{
		"rows":                  r.Rows,
		"bytes":                 r.Bytes,
		"wire_bytes":            r.WireBytes,
		"rejoin_seconds":        r.Seconds,
		"rows_per_sec":          r.RowsPerSec,
		"mb_per_sec":            r.MBPerSec,
		"handoff_pause_ms":      float64(r.HandoffPause.Microseconds()) / 1000,
		"rounds":                r.Rounds,
		"log_bytes_peak":        r.LogBytesPeak,
		"writes_per_sec_before": r.WritesBeforePerSec,
		"writes_per_sec_during": r.WritesDuringPerSec,
		"write_ratio":           r.WriteRatio,
		"common_txn_id":         r.CommonTxnID.String(),
		// Both replicas' digest at common_txn_id: RunRejoin compares
		// them and fails the run if they differ.
		"digest": fmt.Sprintf("%016x", r.Digest),
	}
}
