package demo

import (
	"bytes"
	"html"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg/vgsvg"
)

// plotSVG is d drawn as SVG, whose paths and texts the tests read.
func plotSVG(t *testing.T, d PlotData) string {
	t.Helper()
	c := vgsvg.New(PlotWidth, PlotHeight)
	if err := drawPlot(c, d); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// Series' colours as the SVG writes them (addLine's colours).
const (
	svgDestination = "stroke:#1F77B4;"
	svgChangeLog   = "stroke:#2CA02C;"
	svgWriter      = "stroke:#9467BD;"
	svgP99         = "stroke:#8C564B;"
)

// paths counts the SVG's paths of a colour: a series' line segments, and
// the line beside its name in the legend.
func paths(svg, stroke string) int {
	return strings.Count(svg, stroke)
}

// svgText is one text of the SVG and its height from the picture's
// bottom (the SVG draws y upwards, inside a flip).
type svgText struct {
	y    float64
	text string
}

var svgTextRE = regexp.MustCompile(`<text x="[^"]*" y="([^"]*)"[^>]*\n?[^>]*>([^<]*)</text>`)

func svgTexts(svg string) []svgText {
	var out []svgText
	for _, m := range svgTextRE.FindAllStringSubmatch(svg, -1) {
		y, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			continue
		}
		out = append(out, svgText{y: -y, text: strings.TrimSpace(html.UnescapeString(m[2]))})
	}
	return out
}

// TestPlotGapsBreakLines: the writer's series with 1.5 s unrecorded, an
// interval without an answered write, and a rejoin whose samples stop for
// 2 s are each drawn as two segments, not one line across the gap.
func TestPlotGapsBreakLines(t *testing.T) {
	base := plotSVG(t, syntheticPlot())
	// One path per segment, one beside the legend's name.
	if paths(base, svgWriter) != 2 || paths(base, svgP99) != 2 || paths(base, svgDestination) != 2 {
		t.Fatalf("without gaps: %d writer, %d p99, %d destination paths; want one line and one legend sample each",
			paths(base, svgWriter), paths(base, svgP99), paths(base, svgDestination))
	}

	d := syntheticPlot()
	var w []WriterPoint
	for _, p := range d.Writer {
		if p.T < 4 || p.T > 5.5 {
			w = append(w, p)
		}
	}
	d.Writer = w
	if got := plotSVG(t, d); paths(got, svgWriter) != 3 || paths(got, svgP99) != 3 {
		t.Errorf("writer with 1.5 s unrecorded: %d writer, %d p99 paths; want 2 segments each, and the legend's", paths(got, svgWriter), paths(got, svgP99))
	}

	d = syntheticPlot()
	d.Writer[20].Writes, d.Writer[20].P99Ms = 0, 0
	if got := plotSVG(t, d); paths(got, svgWriter) != 2 || paths(got, svgP99) != 3 {
		t.Errorf("an interval without an answered write: %d writer, %d p99 paths; want the writer whole and p99 in 2 segments", paths(got, svgWriter), paths(got, svgP99))
	}

	d = syntheticPlot()
	var r []RejoinPoint
	for _, p := range d.Rejoin {
		if p.T < 3.5 || p.T > 5.5 {
			r = append(r, p)
		}
	}
	d.Rejoin = r
	if got := plotSVG(t, d); paths(got, svgDestination) != 3 {
		t.Errorf("rejoin samples stopped for 2 s: %d destination paths; want 2 segments and the legend's", paths(got, svgDestination))
	}
	rates := rejoinRates(r, plotBin, 80)
	if v := rates["destination"][45]; !math.IsNaN(v) {
		t.Errorf("destination rate at 4.6 s, inside the gap: %v, want NaN (no line)", v)
	}
	if v := rates["destination"][30]; math.IsNaN(v) || v <= 0 {
		t.Errorf("destination rate at 3.1 s, before the gap: %v", v)
	}
	// The sources' change log is not carried over the gap either: a
	// sample held to the next one drew a flat line through 2 s unseen.
	logMB, _ := changeLog(r, plotBin, 80)
	if v := logMB[45]; !math.IsNaN(v) {
		t.Errorf("change log at 4.6 s, inside the gap: %v, want NaN (no line)", v)
	}
	if got := plotSVG(t, d); paths(got, svgChangeLog) != 3 {
		t.Errorf("rejoin samples stopped for 2 s: %d change log paths; want 2 segments and the legend's", paths(got, svgChangeLog))
	}
}

// TestPlotLegendClearOfEvents: the events' names stand in the strip above
// every panel, so none is under a legend: each name is higher in the
// picture than the highest legend entry.
func TestPlotLegendClearOfEvents(t *testing.T) {
	texts := svgTexts(plotSVG(t, syntheticPlot()))
	events := map[string]bool{"kill n3": true, "restart n3": true, "all live": true, "stream": true, "catch-up": true, "handoff": true, "live": true}
	legends := map[string]bool{"destinations (applied)": true, "sources (sent)": true, "sources' change log": true, "throttled": true, "writer": true, "writer p99": true}
	lowestEvent, highestLegend, nEvents, nLegends := math.Inf(1), math.Inf(-1), 0, 0
	for _, tx := range texts {
		switch {
		case events[tx.text]:
			lowestEvent = min(lowestEvent, tx.y)
			nEvents++
		case legends[tx.text]:
			highestLegend = max(highestLegend, tx.y)
			nLegends++
		}
	}
	if nEvents != len(events) || nLegends != len(legends) {
		t.Fatalf("%d event names, %d legend entries in the picture; want %d and %d", nEvents, nLegends, len(events), len(legends))
	}
	// A name's baseline above the top legend entry's by more than a line
	// of its 9 pt text.
	if lowestEvent-highestLegend < 9 {
		t.Fatalf("the lowest event name at %.1f pt, the highest legend entry at %.1f pt: they can overlap", lowestEvent, highestLegend)
	}
}

// TestTimeTicks: the time axis has plotTicksMin..plotTicksMax labels at a
// round step, whatever the run's length, and the picture shows them.
func TestTimeTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		step   float64
	}{
		{0, 7, 0.5}, {1.3, 2.1, 0.1}, {0.5, 1.2, 0.05}, {0, 60, 5}, {3, 300, 30}, {0, 1200, 120}, {0, 7200, 600},
	} {
		ticks := timeTicks{}.Ticks(tc.lo, tc.hi)
		var labelled []float64
		for _, tk := range ticks {
			if tk.Label != "" {
				labelled = append(labelled, tk.Value)
				if tk.Value < tc.lo-1e-9 || tk.Value > tc.hi+1e-9 {
					t.Errorf("%v..%v: tick %v off the axis", tc.lo, tc.hi, tk.Value)
				}
				if want := strconv.FormatFloat(tk.Value, 'f', -1, 64); tk.Label != want && math.Abs(tk.Value) > 1e-9 {
					t.Errorf("%v..%v: tick %v labelled %q, want %q", tc.lo, tc.hi, tk.Value, tk.Label, want)
				}
			}
		}
		if len(labelled) < plotTicksMin || len(labelled) > plotTicksMax {
			t.Errorf("%v..%v: %d labelled ticks %v, want %d..%d", tc.lo, tc.hi, len(labelled), labelled, plotTicksMin, plotTicksMax)
			continue
		}
		for i := 1; i < len(labelled); i++ {
			if d := labelled[i] - labelled[i-1]; math.Abs(d-tc.step) > 1e-9 {
				t.Errorf("%v..%v: step %v between %v and %v, want %v", tc.lo, tc.hi, d, labelled[i-1], labelled[i], tc.step)
			}
		}
	}
	// The synthetic run's 0..7 s: every half second labelled on each of
	// the four panels' axes.
	n := 0
	for _, tx := range svgTexts(plotSVG(t, syntheticPlot())) {
		if tx.text == "6.5" {
			n++
		}
	}
	if n != 4 {
		t.Errorf("the label 6.5 on %d time axes, want 4", n)
	}
}
