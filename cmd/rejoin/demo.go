package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
)

const demoUsage = `usage: rejoin demo [flags]

Starts an embedded etcd and a cluster of node processes (this binary) on
loopback in a temporary directory, loads rows into table kv, starts a
writer through the gateway node n1 (never a fault target), kills the last
node with SIGKILL and restarts it, lets its replicas rejoin while the
writer goes on, with --fault injected in the middle of a snapshot stream,
then checks every replica's digest at a common txn ID and reads every
acknowledged write back. Exit status 1 if a digest differs or an
acknowledged write was lost. Every process it starts is stopped when it
ends, also on Ctrl-C and on failure.

Faults: none; kill-source (SIGKILL the source of a rejoining partition,
needs --replicas >= 3); kill-destination (SIGKILL the rejoining node
again); cut-link (close the rejoin's TCP connection: it resumes);
pause-holder (stop the source's claim holder past its claim's lease: the
task moves; pause-executor, its old name, is taken too);
pause-etcd (run etcd as a process of its own and SIGSTOP it for 3x the
node TTL + 1s: every node loses its registration and keeps running, the
rejoin starts again once etcd answers).

flags:
`

// demoFlags binds the flags of `rejoin demo` to a demo.Config.
type demoFlags struct {
	cfg        demo.Config
	partitions uint
	fault      string
}

func newDemoFlags(fs *flag.FlagSet) *demoFlags {
	f := &demoFlags{}
	fs.IntVar(&f.cfg.Nodes, "nodes", 3, "node processes")
	fs.UintVar(&f.partitions, "partitions", 4, "partitions")
	fs.IntVar(&f.cfg.Replicas, "replicas", 2, "replicas of each partition, on distinct nodes")
	fs.IntVar(&f.cfg.Rows, "rows", 1_000_000, "rows loaded before the kill")
	fs.IntVar(&f.cfg.ValueBytes, "value-bytes", 100, "bytes of each row's value (keys are 16 bytes)")
	fs.IntVar(&f.cfg.WriteRate, "write-rate", 0, "the writer's writes per second (0: as fast as it can)")
	fs.IntVar(&f.cfg.Writers, "writers", 64, "the writer's concurrent callers")
	fs.BoolVar(&f.cfg.WriteAll, "write-all", false, "write through every node, the killed ones included (their writes in flight become uncertain), not the gateway n1 only")
	names := make([]string, len(demo.Faults))
	for i, x := range demo.Faults {
		names[i] = string(x)
	}
	fs.StringVar(&f.fault, "fault", "none", "fault in the middle of the snapshot stream: "+strings.Join(names, ", "))
	fs.BoolVar(&f.cfg.JSON, "json", false, "print one JSON object (no progress bars)")
	fs.BoolVar(&f.cfg.Keep, "keep", false, "leave the cluster running after the summary, until Ctrl-C")
	fs.StringVar(&f.cfg.Dir, "dir", "", "working `directory` (default: a new temporary one, removed at the end unless --keep)")
	fs.DurationVar(&f.cfg.Timeout, "timeout", 10*time.Minute, "bound of the run up to the summary")
	fs.DurationVar(&f.cfg.Before, "before", 2*time.Second, "the writer's measured interval before the kill")
	fs.DurationVar(&f.cfg.NodeTTL, "node-ttl", 4*time.Second, "the nodes' lease TTL in etcd")
	fs.DurationVar(&f.cfg.ClaimTTL, "claim-ttl", 5*time.Second, "rejoin claims' lease TTL")
	fs.IntVar(&f.cfg.IncomingMax, "incoming-max", 0, "rejoins a node runs at once as destination (0: --partitions)")
	fs.IntVar(&f.cfg.OutgoingMax, "outgoing-max", 0, "rejoins a node serves at once as source (0: --incoming-max)")
	fs.Int64Var(&f.cfg.RateBytes, "rate-bytes", 0, "rate limit of each rejoin stream in bytes/s (0: none)")
	fs.DurationVar(&f.cfg.PaceTarget, "pace-target", 0, "the nodes' --pace-target: a snapshot stream slows while its partition's txns wait longer than this at the source (0: the node's default, negative: never paced)")
	fs.StringVar(&f.cfg.Plot, "plot", "", "draw the run in this PNG `file` (rejoin rows/s, change log, writes/s and p99 on one time axis), its data beside it in .csv")
	fs.BoolVar(&f.cfg.Insecure, "insecure", false, "run the nodes without TLS (by default the demo makes a CA and certificates in its directory and every connection is mutual TLS)")
	return f
}

func (f *demoFlags) config() (demo.Config, error) {
	cfg := f.cfg
	if f.partitions < 1 || f.partitions > 1<<16 {
		return cfg, fmt.Errorf("--partitions %d, want 1..65536", f.partitions)
	}
	if cfg.Replicas < 2 {
		// The config takes 0 for its default; a flag of 0 is a mistake.
		return cfg, fmt.Errorf("--replicas %d, want 2 or more: a killed node's replicas rejoin from the live ones", cfg.Replicas)
	}
	cfg.Partitions = uint32(f.partitions)
	cfg.Fault = demo.Fault(f.fault)
	// Bars redraw in place on a terminal; into a file or a pipe they
	// would repeat every frame, so there the event lines say it all.
	cfg.Progress = !cfg.JSON && isTerminal(os.Stdout)
	return cfg, nil
}

func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	f := newDemoFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, demoUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, "demo", args, stderr); err != nil {
		return err
	}
	cfg, err := f.config()
	if err == nil {
		cfg.Binary, err = os.Executable()
	}
	if err == nil {
		err = cfg.Check()
	}
	if err != nil {
		fmt.Fprintf(stderr, "rejoin demo: %s\n", userMessage("demo", err, nil))
		return errUsage
	}
	cfg.Stderr = stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	_, err = demo.Run(ctx, cfg, stdout)
	return err
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
