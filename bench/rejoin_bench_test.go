package bench

import (
	"context"
	"testing"

	"github.com/rejoin-db/rejoin/wire"
)

// BenchmarkRejoinInProcess runs whole rejoins through RunRejoin's drivers,
// one per iteration: the source partition is loaded with the timer
// stopped, the rest is timed. ns/op is overridden by the rejoin's own
// time (start to the destination live), because an iteration also holds
// the writer's warm-up and before-window and the final digest check, which
// are not the figure. Run it once per case (-benchtime=1x): an iteration
// of rows=5e6 takes seconds and gigabytes.
//
// Metrics: rows/s (the partition's rows over the rejoin's time), MB/s
// (tuple bytes streamed, catch-up included), handoff-ms (the source's
// hold), rounds (catch-up rounds, the final delta included) and, with the
// writer, write-ratio (the source's executed txns per second during the
// rejoin over before it).
func BenchmarkRejoinInProcess(b *testing.B) {
	for _, bc := range []struct {
		name   string
		rows   int
		writer bool
		codec  wire.Codec
	}{
		{"rows=1e6/writer=none", 1e6, false, wire.CodecNone},
		{"rows=1e6/writer=on", 1e6, true, wire.CodecNone},
		{"rows=1e6/writer=none/codec=s2", 1e6, false, wire.CodecS2},
		{"rows=1e6/writer=on/codec=s2", 1e6, true, wire.CodecS2},
		{"rows=5e6/writer=none", 5e6, false, wire.CodecNone},
		{"rows=5e6/writer=on", 5e6, true, wire.CodecNone},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.rows > 1e6 && testing.Short() {
				b.Skip("5e6 rows: skipped under -short")
			}
			cfg := RejoinConfig{Rows: bc.rows, Writer: bc.writer, Codec: bc.codec, Seed: 1}
			var sum RejoinResult
			for range b.N {
				b.StopTimer()
				r, err := NewRejoin(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				res, err := r.Run(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				b.Logf("rows %d (streamed %d, catch-up %d) in %.3fs; %.1f MB tuples, %.1f MB on the wire; handoff %v (%d ticks); rounds %d; log peak %d B; throttled %d ticks; writes/s before %.0f during %.0f (offered %.0f); source queue peak %d; destination buffered %d, dropped %d, late %d",
					res.Rows, res.StreamedRows, res.CatchUpRows, res.Seconds, float64(res.Bytes)/1e6, float64(res.WireBytes)/1e6,
					res.HandoffPause, res.HandoffPauseTicks, res.Rounds, res.LogBytesPeak, res.ThrottledTicks,
					res.WritesBeforePerSec, res.WritesDuringPerSec, res.WriterOfferedPerSec, res.SourceQueuePeak, res.TxnsBuffered, res.TxnsDropped, res.TxnsLate)
				sum.Seconds += res.Seconds
				sum.Rows += res.Rows
				sum.Bytes += res.Bytes
				sum.HandoffPause += res.HandoffPause
				sum.Rounds += res.Rounds
				sum.WriteRatio += res.WriteRatio
			}
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(sum.Seconds*1e9/n, "ns/op")
			b.ReportMetric(float64(sum.Rows)/sum.Seconds, "rows/s")
			b.ReportMetric(float64(sum.Bytes)/1e6/sum.Seconds, "MB/s")
			b.ReportMetric(float64(sum.HandoffPause.Microseconds())/1e3/n, "handoff-ms")
			b.ReportMetric(float64(sum.Rounds)/n, "rounds")
			if bc.writer {
				b.ReportMetric(sum.WriteRatio/n, "write-ratio")
			}
		})
	}
}
