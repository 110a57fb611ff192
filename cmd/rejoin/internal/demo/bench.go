package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The across-process bench (`rejoin bench --processes`) is the demo's run
// in one fixed shape: two node processes with every partition on both, a
// writer at a fixed offered rate through n1, n2 killed and restarted, so
// that n2 rejoins every row of the cluster from n1 while n1 serves the
// writes. It is the shape of a Redis replica's full resync of N keys from
// its primary, and its figures are the demo's with the writer's served
// share of the offered rate beside them.

// BenchNodes and BenchReplicas are the bench's cluster.
const (
	BenchNodes    = 2
	BenchReplicas = 2
)

// BenchSummary is what a bench measured: the demo's summary, and the
// writer's figures against its offered rate.
type BenchSummary struct {
	Summary
	// OfferedWritesPerSec is the writer's fixed offered rate.
	OfferedWritesPerSec float64 `json:"offered_writes_per_sec"`
	// ServedRatioBefore and ServedRatioDuring are the writes acknowledged
	// per second over the offered rate, before the kill and from the
	// restart to every replica live: 1 is every offer served. An offer
	// that finds every caller busy is missed, not queued, so a writer
	// slowed by the rejoin shows here.
	ServedRatioBefore float64 `json:"served_ratio_before"`
	ServedRatioDuring float64 `json:"served_ratio_during"`
	// WritesDuring were acknowledged from the restart to all live;
	// WritesMissedDuring were offered then and found every caller busy.
	WritesDuring       int64 `json:"writes_during"`
	WritesMissedDuring int64 `json:"writes_missed_during"`
	// Redis is set by `rejoin bench --redis` (BenchRedis) only: there the
	// Summary's fields hold a Redis replica's full resync where they
	// mean the same thing, and the rest are zero.
	Redis *RedisRun `json:"redis,omitempty"`
}

// BenchConfig returns cfg in the bench's shape. It refuses a shape, a
// fault or a writer the bench does not run, rather than change it
// silently.
func BenchConfig(cfg Config) (Config, error) {
	switch {
	case cfg.Nodes != 0 && cfg.Nodes != BenchNodes:
		return cfg, fmt.Errorf("demo: bench: %d nodes; the bench runs %d", cfg.Nodes, BenchNodes)
	case cfg.Replicas != 0 && cfg.Replicas != BenchReplicas:
		return cfg, fmt.Errorf("demo: bench: %d replicas; the bench runs %d, every partition on both nodes", cfg.Replicas, BenchReplicas)
	case cfg.Fault != "" && cfg.Fault != FaultNone:
		return cfg, fmt.Errorf("demo: bench: fault %q; the bench injects none (see rejoin demo --fault)", cfg.Fault)
	case cfg.WriteAll:
		return cfg, errors.New("demo: bench: the writer goes through n1 only, the node not killed")
	case cfg.WriteRate <= 0:
		return cfg, fmt.Errorf("demo: --write-rate %d: the bench offers a fixed rate, so 1 or more", cfg.WriteRate)
	}
	cfg.Nodes, cfg.Replicas, cfg.Fault = BenchNodes, BenchReplicas, FaultNone
	return cfg, cfg.Check()
}

// Bench runs the across-process bench (cfg goes through BenchConfig) and
// prints its summary on out: text, or one JSON object with cfg.JSON. Its
// errors are Run's: ErrCheck (wrapped) when a digest differs or an
// acknowledged write was lost.
func Bench(ctx context.Context, cfg Config, out io.Writer) (BenchSummary, error) {
	cfg, err := BenchConfig(cfg)
	if err != nil {
		return BenchSummary{}, err
	}
	var during WindowStats
	sum, err := runWith(ctx, cfg, out, "bench", func(r *run) error {
		during = r.during
		bs := benchSummary(cfg, r.sum, during)
		if cfg.JSON {
			return WriteBenchJSON(out, bs)
		}
		return WriteBenchText(out, bs)
	})
	return benchSummary(cfg, sum, during), err
}

func benchSummary(cfg Config, sum Summary, during WindowStats) BenchSummary {
	rate := float64(cfg.WriteRate)
	return BenchSummary{Summary: sum, OfferedWritesPerSec: rate,
		ServedRatioBefore: sum.WritesPerSecBefore / rate, ServedRatioDuring: sum.WritesPerSecDuring / rate,
		WritesDuring: during.Writes, WritesMissedDuring: during.Missed}
}

// WriteBenchJSON prints the bench's summary as one JSON object on one
// line: the demo summary's fields and the bench's.
func WriteBenchJSON(w io.Writer, s BenchSummary) error {
	return json.NewEncoder(w).Encode(s)
}

// WriteBenchText prints the bench's summary for a reader.
func WriteBenchText(w io.Writer, s BenchSummary) error {
	if s.Redis != nil {
		return writeRedisBenchText(w, s)
	}
	verdict := "OK"
	if !s.DigestsMatch || s.AckedWritesLost > 0 {
		verdict = "FAILED"
	}
	sec := "mutual TLS on every node connection and etcd"
	if !s.TLS {
		sec = "INSECURE (--insecure): no TLS"
	}
	fmt.Fprintf(w, "\n== rejoin bench --processes: %s ==\n", verdict)
	fmt.Fprintf(w, "cluster     %d node processes on loopback, %d partitions x %d replicas (every partition on both); %s\n",
		s.Nodes, s.Partitions, s.Replicas, sec)
	fmt.Fprintf(w, "load        %d rows at %.0f rows/s\n", s.LoadRows, s.LoadRowsPerSec)
	fmt.Fprintf(w, "rejoin      %s killed and restarted: %d rows (%d snapshot), %.1f MB in %d partition rejoins; %.2f s from restart to all live\n",
		s.Victim, s.Rows, s.SnapshotRows, float64(s.Bytes)/1e6, s.RejoinedTasks, s.RejoinSeconds)
	fmt.Fprintf(w, "stream      %.2f s: %.0f rows/s, %.1f MB/s; handoff pause max %.2f ms\n",
		s.StreamSeconds, s.RowsPerSec, s.MBPerSec, s.HandoffPauseMs)
	writeBenchWrites(w, s, "before the kill", "during the rejoin")
	return writeChecks(w, s.Summary)
}

// writeBenchWrites prints the writer's figures before and during what
// the bench measures (before and during name the two).
func writeBenchWrites(w io.Writer, s BenchSummary, before, during string) {
	fmt.Fprintf(w, "writes      offered %.0f/s through %s; served %s %.0f/s (%.1f%% of offered, p99 %.2f ms)\n",
		s.OfferedWritesPerSec, s.Gateway, before, s.WritesPerSecBefore, 100*s.ServedRatioBefore, s.WriteP99MsBefore)
	fmt.Fprintf(w, "            served %s %.0f/s (%.1f%% of offered, p99 %.2f ms; %d offers missed); %d failed, %d uncertain\n",
		during, s.WritesPerSecDuring, 100*s.ServedRatioDuring, s.WriteP99MsDuring, s.WritesMissedDuring, s.WriteErrors, s.WritesUncertain)
}
