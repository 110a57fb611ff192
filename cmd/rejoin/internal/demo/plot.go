package demo

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The picture: four panels on one time axis, PlotWidth x PlotHeight at
// plotDPI. plotBin is the width of the bins the rejoins' samples are
// summed in (the nodes' sampling interval, node.TimelineEvery).
const (
	PlotWidth  = 12 * vg.Inch
	PlotHeight = 10 * vg.Inch
	plotDPI    = 96
	plotBin    = 0.1
	// plotBinsMax bounds the bins drawn: a run longer than plotBinsMax x
	// plotBin is drawn with wider bins.
	plotBinsMax = 20_000
	// plotGapMax is the longest time between two samples of a series that
	// a line joins: ten of the nodes' and the writer's 100 ms intervals.
	// Past it nothing was recorded (a node paused or killed, a writer
	// stalled), and a line across would draw a ramp that never happened.
	plotGapMax = 1.0
	// plotTicksMin and plotTicksMax bound the time axis's labelled ticks.
	plotTicksMin, plotTicksMax = 6, 16
)

// CheckPlotPath checks a --plot path: a PNG file, its CSV beside it.
func CheckPlotPath(path string) error {
	if !strings.EqualFold(filepath.Ext(path), ".png") {
		return fmt.Errorf("demo: --plot %q: want a file name ending in .png (its data goes beside it, in .csv)", path)
	}
	return nil
}

// PlotCSVPath is where the CSV of a --plot PNG goes.
func PlotCSVPath(pngPath string) string {
	return strings.TrimSuffix(pngPath, filepath.Ext(pngPath)) + ".csv"
}

// SavePlot writes d's CSV beside pngPath, reads it back and draws the
// picture from what it read: the CSV holds everything the picture shows.
func SavePlot(pngPath string, d PlotData) (err error) {
	if err := CheckPlotPath(pngPath); err != nil {
		return err
	}
	csvPath := PlotCSVPath(pngPath)
	if err := writeFile(csvPath, func(w io.Writer) error { return WritePlotCSV(w, d) }); err != nil {
		return err
	}
	f, err := os.Open(csvPath)
	if err != nil {
		return err
	}
	back, err := ReadPlotCSV(f)
	f.Close()
	if err != nil {
		return err
	}
	return writeFile(pngPath, func(w io.Writer) error { return DrawPlot(w, back) })
}

// writeFile writes a file through a temporary one, so a failed write
// leaves no half file under the name.
func writeFile(path string, write func(io.Writer) error) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// DrawPlot draws d as a PNG on w: the rejoins' rows/s (destinations
// applied, sources sent), the sources' change-log peak with the
// intervals a source was throttled, the writer's writes/s and its p99,
// with the run's events and the destinations' phases (the stream, the
// catch-up, the handoff, live) as vertical lines across all four.
func DrawPlot(w io.Writer, d PlotData) error {
	c := vgimg.NewWith(vgimg.UseWH(PlotWidth, PlotHeight), vgimg.UseDPI(plotDPI))
	if err := drawPlot(c, d); err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(w); err != nil {
		return fmt.Errorf("demo: plot: %w", err)
	}
	return nil
}

// drawPlot draws d on c, a canvas of PlotWidth x PlotHeight: the PNG's,
// or in tests an SVG one, whose paths and texts can be read back.
func drawPlot(c vg.CanvasSizer, d PlotData) error {
	// The axis runs from a second before the first event (the kill),
	// so the rejoin is not squeezed at the end of a long run.
	end, begin := 0.0, math.Inf(1)
	for _, m := range d.Marks {
		end, begin = max(end, m.T), min(begin, m.T)
	}
	begin = max(0, begin-1)
	for _, p := range d.Writer {
		end = max(end, p.T)
	}
	for _, p := range d.Rejoin {
		end = max(end, p.T)
	}
	if end <= 0 || begin >= end {
		begin = 0
	}
	if end <= 0 {
		return errors.New("demo: nothing to plot")
	}
	bin := max(plotBin, end/plotBinsMax)
	bins := int(math.Ceil(end/bin)) + 1

	rates := rejoinRates(d.Rejoin, bin, bins)
	logMB, throttled := changeLog(d.Rejoin, bin, bins)

	panels := []*plot.Plot{newPanel("", "rejoin k rows/s"), newPanel("", "change log MB (peak)"),
		newPanel("", "writes/s"), newPanel("", "write p99 ms")}
	for _, v := range rates {
		for i := range v {
			v[i] /= 1000
		}
	}
	addLine(panels[0], binXYs(rates["destination"], bin), "destinations (applied)", color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff})
	addLine(panels[0], binXYs(rates["source"], bin), "sources (sent)", color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff})
	addLine(panels[1], binXYs(logMB, bin), "sources' change log", color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff})
	if len(throttled) > 0 {
		sc, err := plotter.NewScatter(throttled)
		if err != nil {
			return err
		}
		sc.Color = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
		sc.Shape = draw.CrossGlyph{}
		panels[1].Add(sc)
		panels[1].Legend.Add("throttled", sc)
	}
	var wps, p99 plotter.XYs
	for i, p := range d.Writer {
		if i > 0 && p.T-d.Writer[i-1].T > plotGapMax {
			wps = append(wps, gapXY)
			p99 = append(p99, gapXY)
		}
		wps = append(wps, plotter.XY{X: p.T, Y: p.WritesPerSec})
		// An interval without an answered write has no p99: a gap, not
		// a line from the one before to the one after.
		y := math.NaN()
		if p.Writes > 0 {
			y = p.P99Ms
		}
		p99 = append(p99, plotter.XY{X: p.T, Y: y})
	}
	addLine(panels[2], wps, "writer", color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff})
	addLine(panels[3], p99, "writer p99", color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff})

	marks := append(append([]PlotMark(nil), d.Marks...), phaseMarks(d.Rejoin)...)
	ticks := timeTicks{}
	for _, p := range panels {
		p.X.Min, p.X.Max = begin, end
		p.X.Tick.Marker = ticks
		if p.Y.Max <= p.Y.Min {
			p.Y.Min, p.Y.Max = 0, 1
		}
		p.Y.Min = min(p.Y.Min, 0)
		// Headroom, so that a line at its peak runs below the legend.
		p.Y.Max += (p.Y.Max - p.Y.Min) / 5
		if err := addMarks(p, marks); err != nil {
			return err
		}
	}
	panels[len(panels)-1].X.Label.Text = "seconds since the writer started"

	dc := draw.New(c)
	pad := draw.Tiles{Rows: 1, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(12)}
	// The events' names go in a strip of their own above the panels, so
	// that no legend, which stands in a panel's top right corner, can
	// cover one. It takes a tenth of the height, the panels the rest.
	area := pad.At(dc, 0, 0)
	stripH := (area.Max.Y - area.Min.Y) / 10
	top, rest := area, area
	top.Min.Y = area.Max.Y - stripH
	rest.Max.Y = top.Min.Y
	grid := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		grid[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadY: vg.Points(6)}
	cs := plot.Align(grid, tiles, rest)
	for i, p := range panels {
		p.Draw(cs[i][0])
	}
	data := panels[0].DataCanvas(cs[0][0])
	toX, _ := panels[0].Transforms(&data)
	drawEvents(top, d.Title, marks, toX)
	return nil
}

// gapXY, between two points of a series, breaks its line there.
var gapXY = plotter.XY{X: math.NaN(), Y: math.NaN()}

// timeTicks labels the time axis every 1, 2 or 5 x 10^k seconds (or 10,
// 15, 30 s and whole minutes past a minute), the step that gives
// plotTicksMin..plotTicksMax labels over the axis, with an unlabelled
// tick between two labelled ones.
type timeTicks struct{}

// timeSteps are the steps timeTicks chooses from, smallest first.
var timeSteps = []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600}

func (timeTicks) Ticks(lo, hi float64) []plot.Tick {
	span := hi - lo
	if !(span > 0) || math.IsInf(span, 0) {
		return nil
	}
	step := timeSteps[len(timeSteps)-1]
	for _, s := range timeSteps {
		if span/s+1 <= plotTicksMax {
			step = s
			break
		}
	}
	var ticks []plot.Tick
	for k := math.Ceil(lo/step*2) / 2; k*step <= hi+step*1e-9; k += 0.5 {
		// Rounded to the steps' precision: 14 x 0.1 is 1.4000000000000001.
		t := plot.Tick{Value: math.Round(k*step*1e6) / 1e6}
		if k == math.Trunc(k) {
			t.Label = strconv.FormatFloat(t.Value, 'f', -1, 64)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

func newPanel(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	return p
}

// addLine draws xys as a line, broken where a point's Y is NaN (no data:
// gapXY, or a bin plotGaps left out), and names it once in p's legend.
func addLine(p *plot.Plot, xys plotter.XYs, name string, c color.Color) {
	named := false
	for _, seg := range lineSegments(xys) {
		l, err := plotter.NewLine(seg)
		if err != nil {
			continue // no finite point: nothing to draw
		}
		l.Color = c
		l.Width = vg.Points(1.2)
		p.Add(l)
		if !named {
			p.Legend.Add(name, l)
			named = true
		}
	}
}

// lineSegments splits xys at its points without a finite X or Y.
func lineSegments(xys plotter.XYs) []plotter.XYs {
	var out []plotter.XYs
	var cur plotter.XYs
	for _, p := range xys {
		if math.IsNaN(p.X) || math.IsNaN(p.Y) || math.IsInf(p.X, 0) || math.IsInf(p.Y, 0) {
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, p)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// addMarks draws a dashed vertical line per mark across p's range.
func addMarks(p *plot.Plot, marks []PlotMark) error {
	for _, m := range marks {
		l, err := plotter.NewLine(plotter.XYs{{X: m.T, Y: p.Y.Min}, {X: m.T, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		l.Color = markColor
		l.Dashes = markDashes
		p.Add(l)
	}
	return nil
}

var (
	markColor  = color.Gray{Y: 0x60}
	markDashes = []vg.Length{vg.Points(4), vg.Points(3)}
)

// markLevels is how many rows the events' names are stepped over in the
// strip, so that names of events close in time do not print over each
// other.
const markLevels = 4

// drawEvents draws the strip above the panels: the title, and each mark's
// dashed line with its name beside it, at x = toX(mark's time), the
// panels' own transform, so a mark continues its panels' line.
func drawEvents(c draw.Canvas, title string, marks []PlotMark, toX func(float64) vg.Length) {
	titleStyle := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, vg.Points(12)), Handler: plot.DefaultTextHandler,
		XAlign: draw.XCenter, YAlign: draw.YTop}
	c.FillText(titleStyle, vg.Point{X: (c.Min.X + c.Max.X) / 2, Y: c.Max.Y}, title)
	top := c.Max.Y
	if title != "" {
		top -= titleStyle.Height(title) + vg.Points(2)
	}
	order := make([]int, len(marks))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return marks[order[a]].T < marks[order[b]].T })
	label := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, vg.Points(8)), Handler: plot.DefaultTextHandler, YAlign: draw.YTop}
	row := (top - c.Min.Y) / markLevels
	line := draw.LineStyle{Color: markColor, Width: vg.Points(1), Dashes: markDashes}
	for k, i := range order {
		x := toX(marks[i].T)
		if x < c.Min.X || x > c.Max.X {
			continue
		}
		c.StrokeLine2(line, x, c.Min.Y, x, top)
		c.FillText(label, vg.Point{X: x, Y: top - vg.Length(k%markLevels)*row}, " "+marks[i].Name)
	}
}

func binXYs(v []float64, bin float64) plotter.XYs {
	xys := make(plotter.XYs, len(v))
	for i, y := range v {
		xys[i] = plotter.XY{X: (float64(i) + 1) * bin, Y: y}
	}
	return xys
}

type attemptKey struct {
	node      string
	partition uint32
	role      string
	peer      string
	epoch     uint64
}

// attempts groups the samples by attempt side, each in time order.
func attempts(ps []RejoinPoint) map[attemptKey][]RejoinPoint {
	by := map[attemptKey][]RejoinPoint{}
	for _, p := range ps {
		k := attemptKey{p.Node, p.Partition, p.Role, p.Peer, p.Epoch}
		by[k] = append(by[k], p)
	}
	for _, s := range by {
		sort.SliceStable(s, func(i, j int) bool { return s[i].T < s[j].T })
	}
	return by
}

// rejoinRates sums each role's rows per second in bins: the rows between
// two samples are spread evenly over the time between them (from the
// attempt's start for the first), so samples a little early or late do
// not make spikes. Two samples more than plotGapMax apart are a gap: when
// their rows went is not known, so they are not drawn, and the bins
// between, where no other attempt of the role did anything, are NaN (no
// line) rather than a ramp; the CSV keeps every sample.
func rejoinRates(ps []RejoinPoint, bin float64, bins int) map[string][]float64 {
	out := map[string][]float64{"destination": make([]float64, bins), "source": make([]float64, bins)}
	gaps := map[string][]bool{"destination": make([]bool, bins), "source": make([]bool, bins)}
	for k, s := range attempts(ps) {
		v := out[k.role]
		if v == nil {
			continue
		}
		t, rows := s[0].StartT, int64(0)
		for _, p := range s {
			if p.T-t > plotGapMax {
				for i := max(0, int(t/bin)+1); i < min(bins, int(math.Ceil(p.T/bin))); i++ {
					gaps[k.role][i] = true
				}
			} else {
				spread(v, bin, t, p.T, float64(p.Rows-rows))
			}
			t, rows = p.T, p.Rows
		}
	}
	for role, v := range out {
		for i := range v {
			v[i] /= bin
			if gaps[role][i] && v[i] == 0 {
				v[i] = math.NaN()
			}
		}
	}
	return out
}

// spread adds amount to the bins over (t0, t1], in proportion.
func spread(v []float64, bin, t0, t1, amount float64) {
	if amount == 0 {
		return
	}
	if t1 <= t0 {
		if i := int(t1 / bin); i >= 0 && i < len(v) {
			v[i] += amount
		}
		return
	}
	for i := max(0, int(t0/bin)); i < len(v) && float64(i)*bin < t1; i++ {
		lo, hi := max(t0, float64(i)*bin), min(t1, float64(i+1)*bin)
		if hi > lo {
			v[i] += amount * (hi - lo) / (t1 - t0)
		}
	}
}

// changeLog sums the sources' change-log peaks per bin, each attempt's
// latest sample carried over its life, and lists the bins in which a
// source was throttled (at the sum's height).
func changeLog(ps []RejoinPoint, bin float64, bins int) ([]float64, plotter.XYs) {
	sum := make([]float64, bins)
	thr := make([]bool, bins)
	gap, held := make([]bool, bins), make([]bool, bins)
	for k, s := range attempts(ps) {
		if k.role != "source" {
			continue
		}
		for j, p := range s {
			from := int(p.T / bin)
			to := from + 1
			if j+1 < len(s) {
				// A sample holds until the next only if that came within
				// plotGapMax: past it, what the log held meanwhile is not
				// known, and the bins between are a gap, as rejoinRates'.
				if next := s[j+1].T; next-p.T <= plotGapMax {
					to = int(next / bin)
				} else {
					for i := max(from+1, 0); i < min(int(next/bin), bins); i++ {
						gap[i] = true
					}
				}
			}
			for i := max(from, 0); i < min(to, bins); i++ {
				sum[i] += float64(p.LogBytesPeak) / 1e6
				held[i] = true
			}
			if p.Throttled && from >= 0 && from < bins {
				thr[from] = true
			}
		}
	}
	for i := range sum {
		if gap[i] && !held[i] {
			sum[i] = math.NaN()
		}
	}
	var xys plotter.XYs
	for i, t := range thr {
		if t {
			xys = append(xys, plotter.XY{X: (float64(i) + 1) * bin, Y: sum[i]})
		}
	}
	return sum, xys
}

// phaseMarks are the rejoins' phases: when the first attempt, on either
// side, was seen streaming, catching up and handing off, and the first
// destination live. A phase shorter than the nodes' sampling interval
// may go unseen, and unmarked.
func phaseMarks(ps []RejoinPoint) []PlotMark {
	names := []struct{ phase, name string }{{"streaming", "stream"}, {"catching-up", "catch-up"}, {"handing-off", "handoff"}, {"live", "live"}}
	var out []PlotMark
	for _, n := range names {
		first := math.Inf(1)
		for _, p := range ps {
			if p.Phase == n.phase {
				first = min(first, p.T)
			}
		}
		if !math.IsInf(first, 1) {
			out = append(out, PlotMark{T: first, Name: n.name})
		}
	}
	return out
}
