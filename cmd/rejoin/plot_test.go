package main

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
)

// TestDemoPlot: `rejoin demo --plot FILE.png` draws the run: the PNG
// decodes, and its CSV holds the writer's points, the run's events and
// both sides of every rejoin, the destinations ending on the rows the
// summary counts.
func TestDemoPlot(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run.png")
	fs := newFlagSet("demo", &bytes.Buffer{})
	f := newDemoFlags(fs)
	if err := fs.Parse([]string{"--plot", path}); err != nil || f.cfg.Plot != path {
		t.Fatalf("--plot: %q, %v", f.cfg.Plot, err)
	}
	cfg := e2eConfig(t, demo.FaultNone)
	cfg.Plot = path
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := demo.Run(ctx, cfg, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("demo: %v\nsummary: %+v", err, sum)
	}
	checkNoNodes(t)
	img, d := readPlot(t, path)
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 600 {
		t.Fatalf("picture %v", b)
	}
	var marks []string
	for _, m := range d.Marks {
		marks = append(marks, m.Name)
	}
	if want := []string{"kill " + sum.Victim, "restart " + sum.Victim, "all live"}; !slices.Equal(marks, want) {
		t.Errorf("marks %v, want %v", marks, want)
	}
	if len(d.Writer) < 10 {
		t.Errorf("%d writer points", len(d.Writer))
	}
	// The destinations' latest rows, per partition, add up to the
	// summary's; every rejoin has a source side too.
	dst, src := map[uint32]int64{}, map[uint32]bool{}
	for _, p := range d.Rejoin {
		switch p.Role {
		case "destination":
			if p.Node != sum.Victim {
				t.Errorf("destination sample on %s, not the victim %s", p.Node, sum.Victim)
			}
			dst[p.Partition] = max(dst[p.Partition], p.Rows)
		case "source":
			src[p.Partition] = true
		}
	}
	var rows int64
	for p, r := range dst {
		rows += r
		if !src[p] {
			t.Errorf("partition %d: no source samples", p)
		}
	}
	if len(dst) == 0 || rows != sum.Rows {
		t.Errorf("destinations' rows %d over %d partitions, summary %d", rows, len(dst), sum.Rows)
	}
}

// readPlot decodes the picture a run drew at path and reads back the data
// beside it (demo.PlotCSVPath).
func readPlot(t *testing.T, path string) (image.Image, demo.PlotData) {
	t.Helper()
	pf, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	img, err := png.Decode(pf)
	if err != nil {
		t.Fatalf("plot %s: %v", path, err)
	}
	cf, err := os.Open(demo.PlotCSVPath(path))
	if err != nil {
		t.Fatal(err)
	}
	defer cf.Close()
	d, err := demo.ReadPlotCSV(cf)
	if err != nil {
		t.Fatal(err)
	}
	return img, d
}
