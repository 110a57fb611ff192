package demo

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// PlotData is what `rejoin demo --plot` draws, on one time axis: seconds
// since the writer started. Its CSV (WritePlotCSV) is written beside the
// picture, and DrawPlot draws from what ReadPlotCSV reads back as well.
type PlotData struct {
	Title string
	// Marks are the run's events: the kill, the restart, every replica
	// live.
	Marks []PlotMark
	// Writer is the writer's throughput and p99 per interval (100 ms).
	Writer []WriterPoint
	// Rejoin are the samples of the rejoins' timelines (GET /timeline) on
	// both sides, into the restarted nodes.
	Rejoin []RejoinPoint
}

// PlotMark is one event of the run.
type PlotMark struct {
	T    float64
	Name string
}

// WriterPoint is the writer over the interval that ends at T.
type WriterPoint struct {
	T            float64
	Writes       int64
	WritesPerSec float64
	// P99Ms is over the interval's writes; 0 when none was answered.
	P99Ms float64
}

// RejoinPoint is one sample of one side of one rejoin attempt, as the
// node that took part in it recorded it (node.TimelineSample); StartT is
// the attempt's start. Counters are cumulative since the start.
type RejoinPoint struct {
	T            float64
	Node         string
	Partition    uint32
	Role         string
	Peer         string
	Epoch        uint64
	StartT       float64
	Phase        string
	Rows, Bytes  int64
	LogBytesPeak int64
	Throttled    bool
	TxnsExecuted uint64
}

// plotCSVHeader: one row per mark, writer point or rejoin sample; the
// first column says which, and the columns the kind has no use for are
// empty.
var plotCSVHeader = []string{"kind", "t_s", "name", "writes", "writes_per_sec", "p99_ms",
	"node", "partition", "role", "peer", "epoch", "start_s", "phase", "rows", "bytes", "log_bytes_peak", "throttled", "txns_executed"}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// WritePlotCSV writes d as CSV: a title row, then plotCSVHeader and the
// rows.
func WritePlotCSV(w io.Writer, d PlotData) error {
	cw := csv.NewWriter(w)
	rows := [][]string{{"title", d.Title}, plotCSVHeader}
	blank := func() []string { return make([]string, len(plotCSVHeader)) }
	for _, m := range d.Marks {
		r := blank()
		r[0], r[1], r[2] = "mark", ftoa(m.T), m.Name
		rows = append(rows, r)
	}
	for _, p := range d.Writer {
		r := blank()
		r[0], r[1], r[3], r[4], r[5] = "writer", ftoa(p.T), strconv.FormatInt(p.Writes, 10), ftoa(p.WritesPerSec), ftoa(p.P99Ms)
		rows = append(rows, r)
	}
	for _, p := range d.Rejoin {
		r := blank()
		r[0], r[1] = "rejoin", ftoa(p.T)
		r[6], r[7], r[8], r[9], r[10] = p.Node, strconv.FormatUint(uint64(p.Partition), 10), p.Role, p.Peer, strconv.FormatUint(p.Epoch, 10)
		r[11], r[12], r[13], r[14] = ftoa(p.StartT), p.Phase, strconv.FormatInt(p.Rows, 10), strconv.FormatInt(p.Bytes, 10)
		r[15], r[16], r[17] = strconv.FormatInt(p.LogBytesPeak, 10), strconv.FormatBool(p.Throttled), strconv.FormatUint(p.TxnsExecuted, 10)
		rows = append(rows, r)
	}
	if err := cw.WriteAll(rows); err != nil {
		return fmt.Errorf("demo: plot data: %w", err)
	}
	return nil
}

// ReadPlotCSV reads what WritePlotCSV wrote.
func ReadPlotCSV(rd io.Reader) (PlotData, error) {
	var d PlotData
	cr := csv.NewReader(rd)
	cr.FieldsPerRecord = -1
	recs, err := cr.ReadAll()
	if err != nil {
		return d, fmt.Errorf("demo: plot data: %w", err)
	}
	if len(recs) < 2 || len(recs[0]) != 2 || recs[0][0] != "title" || len(recs[1]) != len(plotCSVHeader) || recs[1][0] != plotCSVHeader[0] {
		return d, errors.New("demo: plot data: not a plot CSV (want a title row and the header)")
	}
	d.Title = recs[0][1]
	for i, r := range recs[2:] {
		line := i + 3
		if len(r) != len(plotCSVHeader) {
			return d, fmt.Errorf("demo: plot data line %d: %d fields, want %d", line, len(r), len(plotCSVHeader))
		}
		p := fieldParser{r: r}
		t := p.float(1)
		switch r[0] {
		case "mark":
			d.Marks = append(d.Marks, PlotMark{T: t, Name: r[2]})
		case "writer":
			d.Writer = append(d.Writer, WriterPoint{T: t, Writes: p.int(3), WritesPerSec: p.float(4), P99Ms: p.float(5)})
		case "rejoin":
			d.Rejoin = append(d.Rejoin, RejoinPoint{T: t, Node: r[6], Partition: uint32(p.uint(7, 32)), Role: r[8], Peer: r[9],
				Epoch: p.uint(10, 64), StartT: p.float(11), Phase: r[12], Rows: p.int(13), Bytes: p.int(14),
				LogBytesPeak: p.int(15), Throttled: p.bool(16), TxnsExecuted: p.uint(17, 64)})
		default:
			return d, fmt.Errorf("demo: plot data line %d: unknown kind %q", line, r[0])
		}
		if p.err != nil {
			return d, fmt.Errorf("demo: plot data line %d: %w", line, p.err)
		}
	}
	return d, nil
}

// fieldParser parses a record's fields, keeping the first error.
type fieldParser struct {
	r   []string
	err error
}

func (p *fieldParser) keep(i int, err error) {
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("column %s: %w", plotCSVHeader[i], err)
	}
}

func (p *fieldParser) float(i int) float64 {
	v, err := strconv.ParseFloat(p.r[i], 64)
	p.keep(i, err)
	return v
}

func (p *fieldParser) int(i int) int64 {
	v, err := strconv.ParseInt(p.r[i], 10, 64)
	p.keep(i, err)
	return v
}

func (p *fieldParser) uint(i, bits int) uint64 {
	v, err := strconv.ParseUint(p.r[i], 10, bits)
	p.keep(i, err)
	return v
}

func (p *fieldParser) bool(i int) bool {
	v, err := strconv.ParseBool(p.r[i])
	p.keep(i, err)
	return v
}
