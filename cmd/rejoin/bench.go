package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rejoin-db/rejoin/bench"
	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
	"github.com/rejoin-db/rejoin/wire"
)

const benchUsage = `usage: rejoin bench [flags]
       rejoin bench --processes [flags]
       rejoin bench --redis [flags]

Without --processes: one rejoin of one partition inside this process
(bench.RunRejoin, the code of BenchmarkRejoinInProcess): no network, no
kernel, the wire's CPU cost included.

With --processes: the across-process bench, on the demo's runner. It starts
an embedded etcd and 2 node processes (this binary) on loopback with every
partition on both, loads --rows rows, starts a writer through n1 at the fixed
offered rate --write-rate (10000/s unless set), kills n2 with SIGKILL,
restarts it and measures its rejoin of every row from n1: the seconds from
the restart to every replica live, rows/s and MB/s while streaming, the
writes served during the rejoin against the offered rate (the served/offered
ratio; offers that find every caller busy are missed, not queued), the
writer's p99 before and during, the longest handoff pause, every replica's
digest at a common txn ID and the acknowledged writes read back (lost
writes). Exit status 1 if a digest differs or an acknowledged write was
lost. It is the shape of a Redis replica's full resync of N keys.

With --redis: that Redis resync, measured to be set beside --processes. It
starts a redis-server master and replica on loopback (redis-server from PATH
or --redis-server; apt-get install redis-server), each in its own temporary
directory, with repl-diskless-sync yes (delay 0) and repl-diskless-load
on-empty-db (a fresh replica loads the RDB from the socket), no persistence.
It loads --rows keys of 16 bytes with --value-bytes values (the rows of
--processes), starts the same open-loop writer at --write-rate through
--writers connections to the master, sends the replica REPLICAOF and
measures: the seconds from REPLICAOF to in sync (link up, no sync in
progress, its offset at the master's), rows/s and MB/s to the link up, the
writes served during the resync against offered, the p99 before and during,
and, with the writer stopped and both offsets equal, both servers' DBSIZE
and DEBUG DIGEST. Exit status 1 if the replica's content differs. Both
servers are stopped and their directories removed at the end, also on
Ctrl-C.

Flags marked [in-process], [processes] or [redis] belong to those modes
only; giving one in another mode is an error.

flags:
`

// The bench's modes.
const (
	benchInProcess = "the in-process bench"
	benchProcesses = "--processes"
	benchRedis     = "--redis"
)

// benchFlagModes are the flags of some modes only, and those modes; every
// other flag is every mode's.
var benchFlagModes = map[string][]string{
	"writer": {benchInProcess}, "codec": {benchInProcess}, "block-bytes": {benchInProcess},
	"window": {benchInProcess}, "seed": {benchInProcess},
	"partitions": {benchProcesses}, "insecure": {benchProcesses}, "plot": {benchProcesses},
	"dir": {benchProcesses}, "rate-bytes": {benchProcesses}, "incoming-max": {benchProcesses},
	"outgoing-max": {benchProcesses},
	"writers":      {benchProcesses, benchRedis}, "timeout": {benchProcesses, benchRedis},
	"before":       {benchProcesses, benchRedis},
	"redis-server": {benchRedis},
}

// runBench runs one in-process rejoin (bench.RunRejoin, the same code as
// BenchmarkRejoinInProcess), with --processes the across-process bench
// (demo.Bench), or with --redis a Redis replica's full resync
// (demo.BenchRedis), and prints what it measured. The flags only fill a
// bench.RejoinConfig, a demo.Config or a demo.RedisConfig.
func runBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", stderr)
	var cfg bench.RejoinConfig
	processes := fs.Bool("processes", false, "the across-process bench: 2 node processes on loopback, one killed and restarted, rejoining every row")
	redisMode := fs.Bool("redis", false, "the same rows and writer on a Redis master, and a fresh Redis replica's full resync of every key (diskless sync and load)")
	redisServer := fs.String("redis-server", "", "[redis] the redis-server `binary` (default: the one in PATH)")
	fs.IntVar(&cfg.Rows, "rows", 1_000_000, "rows in the source partition; with --processes, rows loaded into the cluster; with --redis, keys loaded into the master")
	fs.IntVar(&cfg.ValueBytes, "value-bytes", 100, "bytes of each row's value (keys are 16 bytes)")
	fs.BoolVar(&cfg.Writer, "writer", false, "[in-process] run a concurrent writer on the source during the rejoin")
	fs.IntVar(&cfg.WriterTxnsPerSec, "write-rate", 100_000, "the writer's offered writes per second (with --processes or --redis: 10000 unless set)")
	codec := fs.String("codec", "none", "[in-process] frame compression: none, s2 or zstd")
	fs.IntVar(&cfg.BlockBytesMax, "block-bytes", 0, "[in-process] tuple bytes per block (0: 256 KiB)")
	fs.IntVar(&cfg.WindowBlocksMax, "window", 0, "[in-process] unacknowledged blocks at most (0: 16)")
	seed := fs.Uint64("seed", 1, "[in-process] seed of the rows and the writer's choices")
	asJSON := fs.Bool("json", false, "print one JSON object instead of text")
	var pcfg demo.Config
	partitions := fs.Uint("partitions", 4, "[processes] partitions, each on both nodes")
	fs.IntVar(&pcfg.Writers, "writers", 256, "[processes, redis] the writer's concurrent callers (with --redis, connections to the master)")
	fs.BoolVar(&pcfg.Insecure, "insecure", false, "[processes] run the nodes and etcd without TLS (by default every connection is mutual TLS)")
	fs.StringVar(&pcfg.Plot, "plot", "", "[processes] draw the run in this PNG `file` (as rejoin demo --plot), its data beside it in .csv")
	fs.StringVar(&pcfg.Dir, "dir", "", "[processes] working `directory` (default: a new temporary one, removed at the end)")
	fs.DurationVar(&pcfg.Timeout, "timeout", 10*time.Minute, "[processes, redis] bound of the run up to the summary")
	fs.DurationVar(&pcfg.Before, "before", 3*time.Second, "[processes, redis] the writer's measured interval before the kill (with --redis, before REPLICAOF)")
	fs.Int64Var(&pcfg.RateBytes, "rate-bytes", 0, "[processes] rate limit of each rejoin stream in bytes/s (0: none)")
	fs.IntVar(&pcfg.IncomingMax, "incoming-max", 0, "[processes] rejoins a node runs at once as destination (0: --partitions)")
	fs.IntVar(&pcfg.OutgoingMax, "outgoing-max", 0, "[processes] rejoins a node serves at once as source (0: --incoming-max)")
	fs.Usage = func() {
		fmt.Fprint(stderr, benchUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, "bench", args, stderr); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	mode := benchInProcess
	switch {
	case *processes && *redisMode:
		fmt.Fprintln(stderr, "rejoin bench: --processes and --redis: pick one")
		return errUsage
	case *processes:
		mode = benchProcesses
	case *redisMode:
		mode = benchRedis
	}
	for name, modes := range benchFlagModes {
		if set[name] && !slices.Contains(modes, mode) {
			fmt.Fprintf(stderr, "rejoin bench: --%s is a flag of %s only\n", name, strings.Join(modes, " and "))
			return errUsage
		}
	}
	writeRate := 10_000
	if set["write-rate"] {
		writeRate = cfg.WriterTxnsPerSec
	}
	if *redisMode {
		return runBenchRedis(demo.RedisConfig{Server: *redisServer, Rows: cfg.Rows, ValueBytes: cfg.ValueBytes,
			WriteRate: writeRate, Writers: pcfg.Writers, Before: pcfg.Before, Timeout: pcfg.Timeout, JSON: *asJSON}, stdout, stderr)
	}
	if *processes {
		if *partitions < 1 || *partitions > 1<<16 {
			fmt.Fprintf(stderr, "rejoin bench: --partitions %d, want 1..65536\n", *partitions)
			return errUsage
		}
		pcfg.Partitions = uint32(*partitions)
		pcfg.Rows, pcfg.ValueBytes, pcfg.JSON = cfg.Rows, cfg.ValueBytes, *asJSON
		pcfg.WriteRate = writeRate
		return runBenchProcesses(pcfg, stdout, stderr)
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
		fmt.Fprintf(stderr, "rejoin bench: %s\n", userMessage("bench", err, flagFields(fs, &cfg)))
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

// runBenchProcesses runs the across-process bench (demo.Bench).
func runBenchProcesses(cfg demo.Config, stdout, stderr io.Writer) error {
	var err error
	if cfg.Binary, err = os.Executable(); err == nil {
		cfg, err = demo.BenchConfig(cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rejoin bench: %s\n", userMessage("demo", err, nil)) // demo's messages begin "demo: "
		return errUsage
	}
	cfg.Stderr = stderr
	cfg.Progress = !cfg.JSON && isTerminal(os.Stdout)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err = demo.Bench(ctx, cfg, stdout)
	return err
}

// runBenchRedis runs a Redis replica's full resync (demo.BenchRedis).
func runBenchRedis(cfg demo.RedisConfig, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := cfg.Check()
	if err != nil {
		fmt.Fprintf(stderr, "rejoin bench: %s\n", userMessage("demo", err, nil)) // demo's messages begin "demo: "
		return errUsage
	}
	_, err = demo.BenchRedis(ctx, cfg, stdout)
	return err
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
