package demo

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
)

// bars draws one progress bar per rejoining partition: rows applied on the
// destination out of the source replica's rows, MB/s, phase.
type bars struct {
	p   *mpb.Progress
	out io.Writer

	mu  sync.Mutex
	all map[taskKey]*taskBar
}

type taskKey struct {
	partition uint32
	dest      string
}

// taskBar is one bar; its text fields are read by the render goroutine.
type taskBar struct {
	bar *mpb.Bar

	mu    sync.Mutex
	phase string
	mbps  float64
	// rate baseline: bytes at firstAt, of attempt epoch.
	epoch   uint64
	base    int64
	firstAt time.Time
}

func (t *taskBar) text() (string, float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.phase, t.mbps
}

func newBars(w io.Writer) *bars {
	return &bars{
		// WithWidth is the line width when w is not a terminal.
		p:   mpb.New(mpb.WithOutput(w), mpb.WithWidth(120), mpb.WithRefreshRate(150*time.Millisecond), mpb.WithAutoRefresh()),
		out: w,
		all: map[taskKey]*taskBar{},
	}
}

// Write prints above the bars.
func (b *bars) Write(p []byte) (int, error) { return b.p.Write(p) }

// update moves the bars to what v says.
func (b *bars) update(v clusterview.View, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range v.Tasks {
		k := taskKey{t.Partition, t.Dest}
		finished := t.Status == "done" || t.Status == "failed" || t.Phase == "live"
		tb := b.all[k]
		if tb == nil || tb.bar.Completed() || tb.bar.Aborted() {
			if finished {
				continue // nothing (more) to draw
			}
			tb = b.add(k)
			b.all[k] = tb
		}
		tb.mu.Lock()
		tb.phase = t.Status
		if t.Phase != "" {
			tb.phase = t.Phase
		}
		if t.Held {
			tb.phase += " (held)"
		}
		if t.Source != "" {
			tb.phase += " from " + t.Source
		}
		if tb.firstAt.IsZero() || t.Epoch != tb.epoch || t.Bytes < tb.base {
			tb.epoch, tb.base, tb.firstAt, tb.mbps = t.Epoch, t.Bytes, now, 0
		} else if d := now.Sub(tb.firstAt).Seconds(); d > 0 {
			tb.mbps = float64(t.Bytes-tb.base) / 1e6 / d
		}
		tb.mu.Unlock()
		switch {
		case t.Status == "failed":
			tb.bar.Abort(false)
		case finished:
			tb.bar.SetCurrent(max(t.Rows, 1))
			tb.bar.SetTotal(max(t.Rows, 1), true)
		default:
			tb.bar.SetTotal(max(t.SourceRows, t.Rows, 1), false)
			tb.bar.SetCurrent(t.Rows)
		}
	}
}

func (b *bars) add(k taskKey) *taskBar {
	tb := &taskBar{phase: "pending"}
	// Total 0: the total is set as the source replica's rows are known.
	tb.bar = b.p.AddBar(0, mpb.BarWidth(30),
		mpb.PrependDecorators(
			decor.Name(fmt.Sprintf("p%d -> %s", k.partition, k.dest), decor.WCSyncSpaceR),
			decor.CountersNoUnit("%d / %d rows", decor.WCSyncSpace),
		),
		mpb.AppendDecorators(
			decor.Percentage(decor.WCSyncSpace),
			decor.Any(func(decor.Statistics) string {
				_, mbps := tb.text()
				return fmt.Sprintf("%6.1f MB/s ", mbps)
			}, decor.WCSyncSpace),
			decor.Any(func(decor.Statistics) string {
				phase, _ := tb.text()
				return phase
			}, decor.WCSyncSpaceR),
		),
	)
	return tb
}

// finish completes or aborts every bar and waits for the last render.
func (b *bars) finish() {
	b.mu.Lock()
	for _, tb := range b.all {
		if !tb.bar.Completed() && !tb.bar.Aborted() {
			tb.bar.Abort(false)
		}
	}
	b.mu.Unlock()
	b.p.Wait()
}
