package demo

import (
	"bytes"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gonum.org/v1/plot/vg"

	"github.com/rejoin-db/rejoin/bench/load"
	"github.com/rejoin-db/rejoin/recovery/node"
)

// syntheticPlot is a rejoin of two partitions as the nodes and the writer
// would record it: a stream, a catch-up with a throttled source, a
// handoff, and the writer's dip while it lasts.
func syntheticPlot() PlotData {
	d := PlotData{Title: `synthetic, "quoted", with a comma`,
		Marks: []PlotMark{{T: 1, Name: "kill n3"}, {T: 2.5, Name: "restart n3"}, {T: 6.25, Name: "all live"}}}
	for i := 1; i <= 70; i++ {
		t := float64(i) / 10
		wps, p99 := 20000.0, 2.0
		if t > 3 && t < 6 {
			wps, p99 = 15000, 9.5
		}
		d.Writer = append(d.Writer, WriterPoint{T: t, Writes: int64(wps / 10), WritesPerSec: wps, P99Ms: p99})
	}
	for p := range uint32(2) {
		for i := range 35 {
			t := 2.7 + float64(i)/10
			phase := "streaming"
			switch {
			case i >= 33:
				phase = "live"
			case i >= 31:
				phase = "handing-off"
			case i >= 25:
				phase = "catching-up"
			}
			rows := int64(min(i, 30)) * 10000
			d.Rejoin = append(d.Rejoin,
				RejoinPoint{T: t, Node: "n3", Partition: p, Role: "destination", Peer: "n1", Epoch: 40 + uint64(p), StartT: 2.6,
					Phase: phase, Rows: rows, Bytes: rows * 120},
				RejoinPoint{T: t + 0.013, Node: "n1", Partition: p, Role: "source", Peer: "n3", Epoch: 40 + uint64(p), StartT: 2.6,
					Phase: strings.Replace(phase, "live", "done", 1), Rows: rows, Bytes: rows * 120, LogBytesPeak: int64(i) << 16,
					Throttled: i >= 25 && i < 28, TxnsExecuted: uint64(1000 + 50*i)})
		}
	}
	return d
}

// TestPlotCSVRoundTrip: the CSV reads back equal to what was written.
func TestPlotCSVRoundTrip(t *testing.T) {
	want := syntheticPlot()
	var b bytes.Buffer
	if err := WritePlotCSV(&b, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPlotCSV(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, want)
	}
	if got := strings.Count(b.String(), "\n"); got != 2+len(want.Marks)+len(want.Writer)+len(want.Rejoin) {
		t.Fatalf("%d lines", got)
	}
	// Bad input is an error naming the line, never a panic.
	lines := strings.Split(b.String(), "\n")
	for _, tc := range []struct{ text, want string }{
		{"", "not a plot CSV"},
		{"title,x\nkind,t_s\n", "not a plot CSV"},
		{strings.Join(lines[:2], "\n") + "\nmark,zz,kill" + strings.Repeat(",", len(plotCSVHeader)-3) + "\n", "line 3: column t_s"},
		{strings.Join(lines[:2], "\n") + "\nnope,1" + strings.Repeat(",", len(plotCSVHeader)-2) + "\n", `unknown kind "nope"`},
		{strings.Join(lines[:2], "\n") + "\nmark,1\n", "line 3: 2 fields"},
		{strings.Replace(b.String(), ",true,", ",yes,", 1), "column throttled"},
	} {
		if _, err := ReadPlotCSV(strings.NewReader(tc.text)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadPlotCSV(%.60q...) = %v, want %q", tc.text, err, tc.want)
		}
	}
}

// TestSavePlot: the PNG is written, decodes, has the plot's size and a
// picture on it; its CSV beside it reads back equal.
func TestSavePlot(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run.png")
	d := syntheticPlot()
	if err := SavePlot(path, d); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != int(float64(PlotWidth/vg.Inch)*plotDPI) || b.Dy() != int(float64(PlotHeight/vg.Inch)*plotDPI) {
		t.Fatalf("picture %v, want %.0fx%.0f", b, float64(PlotWidth/vg.Inch)*plotDPI, float64(PlotHeight/vg.Inch)*plotDPI)
	}
	// Lines of several colours on white: far from one colour, and most
	// of it background.
	colours, white := map[[4]uint32]bool{}, 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, bl, a}] = true
			if r == 0xffff && g == 0xffff && bl == 0xffff {
				white++
			}
		}
	}
	if total := (b.Dx() / 2) * (b.Dy() / 2); len(colours) < 20 || white < total/2 || white == total {
		t.Fatalf("%d colours, %d of %d sampled pixels white: not a plot", len(colours), white, total)
	}
	cf, err := os.Open(PlotCSVPath(path))
	if err != nil {
		t.Fatal(err)
	}
	defer cf.Close()
	back, err := ReadPlotCSV(cf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, d) {
		t.Fatal("the CSV beside the plot does not read back equal")
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}

	if err := SavePlot(filepath.Join(dir, "run.svg"), d); err == nil || !strings.Contains(err.Error(), ".png") {
		t.Fatalf("SavePlot to .svg: %v", err)
	}
	if err := DrawPlot(&bytes.Buffer{}, PlotData{}); err == nil {
		t.Fatal("DrawPlot of nothing: no error")
	}
	if err := (&Config{Binary: "x", Plot: "out.jpg"}).Check(); err == nil || !strings.Contains(err.Error(), "--plot") {
		t.Fatalf("Check with --plot out.jpg: %v", err)
	}
}

// TestRejoinRates: rows between two samples are spread over the time
// between them, from the attempt's start; each role sums its attempts.
func TestRejoinRates(t *testing.T) {
	ps := []RejoinPoint{
		{T: 0.1, Role: "destination", Partition: 0, StartT: 0, Rows: 100},
		{T: 0.3, Role: "destination", Partition: 0, StartT: 0, Rows: 300},
		{T: 0.3, Role: "destination", Partition: 1, StartT: 0.2, Rows: 50},
		{T: 0.2, Role: "source", Partition: 0, StartT: 0, Rows: 400},
	}
	got := rejoinRates(ps, 0.1, 4)
	approx := func(a, b []float64) bool {
		for i := range a {
			if math.Abs(a[i]-b[i]) > 1e-6 {
				return false
			}
		}
		return len(a) == len(b)
	}
	if want := []float64{1000, 1000, 1500, 0}; !approx(got["destination"], want) {
		t.Errorf("destination %v, want %v", got["destination"], want)
	}
	if want := []float64{2000, 2000, 0, 0}; !approx(got["source"], want) {
		t.Errorf("source %v, want %v", got["source"], want)
	}
	log, thr := changeLog([]RejoinPoint{
		{T: 0.05, Role: "source", LogBytesPeak: 1e6},
		{T: 0.25, Role: "source", LogBytesPeak: 3e6, Throttled: true},
		{T: 0.15, Role: "source", Partition: 1, LogBytesPeak: 2e6},
		{T: 0.15, Role: "destination", Partition: 2, LogBytesPeak: 9e6},
	}, 0.1, 4)
	if want := []float64{1, 3, 3, 0}; !approx(log, want) {
		t.Errorf("change log %v, want %v", log, want)
	}
	if len(thr) != 1 || math.Abs(thr[0].X-0.3) > 1e-9 || thr[0].Y != 3 {
		t.Errorf("throttled %v", thr)
	}
	marks := phaseMarks(syntheticPlot().Rejoin)
	var names []string
	for _, m := range marks {
		names = append(names, m.Name)
	}
	if !reflect.DeepEqual(names, []string{"stream", "catch-up", "handoff", "live"}) || math.Abs(marks[0].T-2.7) > 1e-9 {
		t.Errorf("phase marks %+v", marks)
	}
}

// TestPlotRec: the recorder samples the writer until finish, keeps the
// run's events, and turns the nodes' timelines of the restarted nodes'
// rejoins into samples on its time axis; its goroutine ends.
func TestPlotRec(t *testing.T) {
	defer goleak.VerifyNone(t)
	var calls atomic.Int64
	start := time.Now()
	snap := func() load.Snapshot {
		n := calls.Add(1)
		var h load.Histogram
		for range n {
			h.Record(3 * time.Millisecond)
		}
		return load.Snapshot{At: start.Add(time.Duration(n) * 100 * time.Millisecond), Txns: n * (n + 1) / 2, Hist: h}
	}
	p := startPlotRec(snap, time.Millisecond)
	p.mark("kill n3")
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() < 5 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	p.finish()
	p.finish()
	var nilRec *plotRec
	nilRec.mark("x")
	nilRec.finish()

	t0 := p.t0
	tls := []node.Timelines{
		{Node: "n3", Rejoins: []node.Timeline{{Partition: 1, Role: "destination", Peer: "n1", Epoch: 5, Started: t0.Add(time.Second),
			Samples: []node.TimelineSample{{At: t0.Add(1500 * time.Millisecond), Phase: "streaming", Rows: 10, Bytes: 100}}}}},
		{Node: "n1", Rejoins: []node.Timeline{
			{Partition: 1, Role: "source", Peer: "n3", Epoch: 5, Started: t0.Add(time.Second),
				Samples: []node.TimelineSample{{At: t0.Add(2 * time.Second), Phase: "done", Rows: 10, LogBytesPeak: 7, Throttled: true, TxnsExecuted: 9}}},
			{Partition: 0, Role: "source", Peer: "n2", Epoch: 6, Started: t0,
				Samples: []node.TimelineSample{{At: t0, Phase: "done"}}},
		}},
	}
	d := p.data("t", p.rejoinPoints(tls, []string{"n3"}))
	if len(d.Marks) != 1 || d.Marks[0].Name != "kill n3" || len(d.Writer) < 4 {
		t.Fatalf("marks %+v, %d writer points", d.Marks, len(d.Writer))
	}
	for i, w := range d.Writer {
		n := int64(i + 2) // the first snapshot is t0
		if w.Writes != n || math.Abs(w.T-float64(n-1)/10) > 1e-9 || math.Abs(w.WritesPerSec-float64(n)*10) > 1e-6 || w.P99Ms < 2.9 || w.P99Ms > 3.1 {
			t.Errorf("writer point %d: %+v", i, w)
		}
	}
	want := []RejoinPoint{
		{T: 1.5, Node: "n3", Partition: 1, Role: "destination", Peer: "n1", Epoch: 5, StartT: 1, Phase: "streaming", Rows: 10, Bytes: 100},
		{T: 2, Node: "n1", Partition: 1, Role: "source", Peer: "n3", Epoch: 5, StartT: 1, Phase: "done", Rows: 10, LogBytesPeak: 7, Throttled: true, TxnsExecuted: 9},
	}
	if !reflect.DeepEqual(d.Rejoin, want) {
		t.Fatalf("rejoin points\n got %+v\nwant %+v", d.Rejoin, want)
	}
	// Bounded: the oldest writer points go.
	for i := range writerPointsMax + 10 {
		p.add(WriterPoint{T: float64(i)})
	}
	if len(p.writer) != writerPointsMax || p.writer[0].T != 10 {
		t.Fatalf("%d writer points, first at %v", len(p.writer), p.writer[0].T)
	}
}
