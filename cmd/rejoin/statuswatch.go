package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// watchForever bounds a `status --watch` that no --count ends: Ctrl-C
// does.
const watchForever = 100 * 365 * 24 * time.Hour

type watchConfig struct {
	every, timeout, nodeTimeout time.Duration
	count                       int
}

// rejoinRow is one rejoining replica as `status --watch` draws it.
type rejoinRow struct {
	Partition    uint32
	Source, Dest string
	Epoch        uint64
	Phase        string
	Rows, Bytes  int64
	// BytesPerSec is the rate since the previous redraw that saw this
	// attempt, or since its start.
	BytesPerSec float64
	// LogBytesPeak and ThrottledMs are the source's: its change log's
	// peak and the time it throttled the stream.
	LogBytesPeak int
	ThrottledMs  float64
	Held         bool
}

// attemptKey names one attempt across redraws.
type attemptKey struct {
	p     uint32
	dest  string
	epoch uint64
}

type sample struct {
	bytes int64
	at    time.Time
}

// rejoinRows lists the rejoin attempts under way in the nodes' statuses,
// from their destinations' side, with the source's side where its node
// answered; prev holds the bytes each attempt had at the previous redraw
// and is updated. Pure but for prev, so tests feed it canned statuses.
func rejoinRows(statuses map[string]node.Status, prev map[attemptKey]sample, now time.Time) []rejoinRow {
	var rows []rejoinRow
	seen := map[attemptKey]bool{}
	for dest, st := range statuses {
		for _, rs := range st.Replicas {
			d := rs.Rejoin
			// A live replica's attempt is done, though a node reports it
			// not ended while its connection lasts: counted, a cluster with
			// every replica live showed '21 rejoining'.
			if d == nil || !d.Ended.IsZero() || rs.State == recovery.ReplicaLive {
				continue
			}
			r := rejoinRow{Partition: rs.Partition, Source: d.Peer, Dest: dest, Epoch: d.Epoch, Phase: d.Phase, Rows: d.Rows, Bytes: d.Bytes, Held: d.Held}
			for _, srs := range statuses[d.Peer].Replicas {
				if srs.Partition != rs.Partition {
					continue
				}
				for _, src := range srs.Sources {
					if src.Peer == dest && src.Epoch == d.Epoch {
						r.LogBytesPeak, r.ThrottledMs, r.Held = src.LogBytesPeak, src.ThrottledMs, r.Held || src.Held
					}
				}
			}
			k := attemptKey{rs.Partition, dest, d.Epoch}
			seen[k] = true
			from := sample{at: d.Started}
			if s, ok := prev[k]; ok {
				from = s
			}
			if dt := now.Sub(from.at).Seconds(); dt > 0 && !from.at.IsZero() {
				r.BytesPerSec = float64(d.Bytes-from.bytes) / dt
			}
			prev[k] = sample{bytes: d.Bytes, at: now}
			rows = append(rows, r)
		}
	}
	for k := range prev {
		if !seen[k] {
			delete(prev, k)
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Partition != rows[j].Partition {
			return rows[i].Partition < rows[j].Partition
		}
		return rows[i].Dest < rows[j].Dest
	})
	return rows
}

// renderRejoins draws one redraw: a header line, then a line per row.
func renderRejoins(w io.Writer, rows []rejoinRow, unanswered []string, now time.Time) error {
	fmt.Fprintf(w, "%s  %d rejoining", now.UTC().Format("15:04:05"), len(rows))
	if len(unanswered) > 0 {
		fmt.Fprintf(w, "  (no /status from %v)", unanswered)
	}
	fmt.Fprintln(w)
	if len(rows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tSOURCE→DEST\tPHASE\tROWS\tMB/S\tCHANGE-LOG\tTHROTTLED")
	for _, r := range rows {
		phase := r.Phase
		if r.Held {
			phase += " (held)"
		}
		fmt.Fprintf(tw, "%d\t%s→%s\t%s\t%d\t%.1f\t%.1f MB\t%.0f ms\n", r.Partition, r.Source, r.Dest, phase, r.Rows,
			r.BytesPerSec/1e6, float64(r.LogBytesPeak)/1e6, r.ThrottledMs)
	}
	return tw.Flush()
}

// watchRejoins redraws the rejoins under way every cfg.every, until ctx
// ends (Ctrl-C) or cfg.count redraws are drawn. A redraw that cannot read
// etcd says so and the next tries again.
func watchRejoins(ctx context.Context, cli *clientv3.Client, hc *http.Client, stdout io.Writer, cfg watchConfig) error {
	clear := isTerminalWriter(stdout) // a redraw clears the screen; elsewhere redraws follow each other
	prev := map[attemptKey]sample{}
	for n := 1; ; n++ {
		rctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		nodes, err := supervise.Nodes(rctx, cli)
		var statuses map[string]node.Status
		var errs map[string]error
		if err == nil {
			statuses, errs = clusterview.FetchAll(rctx, hc, nodes, cfg.nodeTimeout)
		}
		cancel()
		if ctx.Err() != nil {
			return nil // interrupted
		}
		if clear {
			fmt.Fprint(stdout, "\033[H\033[2J")
		}
		now := time.Now()
		if err != nil {
			fmt.Fprintf(stdout, "%s  etcd did not answer within --timeout %s: %v\n", now.UTC().Format("15:04:05"), cfg.timeout, err)
		} else {
			var unanswered []string
			for id := range errs {
				unanswered = append(unanswered, id)
			}
			sort.Strings(unanswered)
			if err := renderRejoins(stdout, rejoinRows(statuses, prev, now), unanswered, now); err != nil {
				return err
			}
		}
		if cfg.count > 0 && n >= cfg.count {
			return nil
		}
		select {
		case <-time.After(cfg.every):
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return ctx.Err()
			}
			return nil
		}
	}
}
