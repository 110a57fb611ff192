package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/rejoin-db/rejoin/bench/load"
	"github.com/rejoin-db/rejoin/recovery/node"
)

// writerPointsMax bounds the writer's points a --plot run keeps: an hour
// at node.TimelineEvery; past it the oldest go.
const writerPointsMax = 36_000

// plotRec records, for --plot, the writer's throughput and p99 every
// node.TimelineEvery (the nodes' own sampling interval) and the run's
// events, from t0, the writer's start. Its methods do nothing on a nil
// plotRec (no --plot).
type plotRec struct {
	t0   time.Time
	stop context.CancelFunc
	done chan struct{}

	mu     sync.Mutex
	marks  []PlotMark
	writer []WriterPoint
}

// startPlotRec samples snap until finish.
func startPlotRec(snap func() load.Snapshot, every time.Duration) *plotRec {
	prev := snap()
	ctx, cancel := context.WithCancel(context.Background())
	p := &plotRec{t0: prev.At, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			cur := snap()
			w := cur.Since(prev)
			prev = cur
			p.add(WriterPoint{T: cur.At.Sub(p.t0).Seconds(), Writes: w.Txns, WritesPerSec: w.TxnsPerSec, P99Ms: w.P99})
		}
	}()
	return p
}

func (p *plotRec) add(pt WriterPoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.writer) == writerPointsMax {
		p.writer = append(p.writer[:0], p.writer[1:]...)
	}
	p.writer = append(p.writer, pt)
}

// mark records an event of the run, now.
func (p *plotRec) mark(name string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marks = append(p.marks, PlotMark{T: time.Since(p.t0).Seconds(), Name: name})
}

// finish stops the sampling; again is harmless.
func (p *plotRec) finish() {
	if p == nil {
		return
	}
	p.stop()
	<-p.done
}

// data is what was recorded, with the rejoin samples given.
func (p *plotRec) data(title string, rejoin []RejoinPoint) PlotData {
	p.mu.Lock()
	defer p.mu.Unlock()
	return PlotData{Title: title, Marks: slices.Clone(p.marks), Writer: slices.Clone(p.writer), Rejoin: rejoin}
}

// rejoinPoints turns the nodes' timelines into samples on p's time axis:
// the sides of the attempts into the nodes in dests.
func (p *plotRec) rejoinPoints(all []node.Timelines, dests []string) []RejoinPoint {
	var out []RejoinPoint
	for _, tls := range all {
		for _, tl := range tls.Rejoins {
			dest := tls.Node
			if tl.Role == "source" {
				dest = tl.Peer
			}
			if !slices.Contains(dests, dest) {
				continue
			}
			start := tl.Started.Sub(p.t0).Seconds()
			for _, s := range tl.Samples {
				out = append(out, RejoinPoint{T: s.At.Sub(p.t0).Seconds(), Node: tls.Node, Partition: tl.Partition, Role: tl.Role,
					Peer: tl.Peer, Epoch: tl.Epoch, StartT: start, Phase: s.Phase, Rows: s.Rows, Bytes: s.Bytes,
					LogBytesPeak: int64(s.LogBytesPeak), Throttled: s.Throttled, TxnsExecuted: s.TxnsExecuted})
			}
		}
	}
	return out
}

// timelines reads every registered node's GET /timeline; a node that
// does not answer (killed again) is left out, with an event line.
func (r *run) timelines(ctx context.Context) ([]node.Timelines, error) {
	v, err := r.view(ctx)
	if err != nil {
		return nil, err
	}
	var out []node.Timelines
	for _, n := range v.Nodes {
		tls, err := r.getTimeline(ctx, n.HTTP)
		if err != nil {
			r.eventf("plot: %s's timeline: %v", n.ID, err)
			continue
		}
		out = append(out, tls)
	}
	return out, nil
}

func (r *run) getTimeline(ctx context.Context, addr string) (node.Timelines, error) {
	var tls node.Timelines
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/timeline", nil)
	if err != nil {
		return tls, err
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return tls, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return tls, fmt.Errorf("GET /timeline: %s", resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&tls)
	return tls, err
}

// savePlot draws the run (cfg.Plot) from the nodes' timelines and what
// the writer measured.
func (r *run) savePlot(ctx context.Context) error {
	if r.plot == nil {
		return nil
	}
	r.plot.finish()
	tls, err := r.timelines(ctx)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("rejoin %s: fault %s, %d nodes, %d partitions x %d replicas, %d rows of %d bytes; writes %s; %s killed and restarted",
		r.name, r.cfg.Fault, r.cfg.Nodes, r.cfg.Partitions, r.cfg.Replicas, r.cfg.Rows, r.cfg.ValueBytes, rateText(r.cfg.WriteRate), r.sum.Victim)
	d := r.plot.data(title, r.plot.rejoinPoints(tls, r.restarted))
	if err := SavePlot(r.cfg.Plot, d); err != nil {
		return err
	}
	r.eventf("plot: %s (%d rejoin samples, %d writer points); data: %s", r.cfg.Plot, len(d.Rejoin), len(d.Writer), PlotCSVPath(r.cfg.Plot))
	return nil
}
