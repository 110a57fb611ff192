package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// RejoinConfig describes one in-process rejoin run. Zero fields take the
// defaults WithDefaults documents; sizes are in bytes, times in wall time
// (the drivers map one tick to Tick).
type RejoinConfig struct {
	// Rows is the source partition's row count before the writer starts.
	Rows int
	// KeyBytes and ValueBytes size each row: a bytes key (at least 8:
	// the row number makes it unique) and a bytes value. Defaults 16, 100.
	KeyBytes, ValueBytes int

	// Writer runs a concurrent writer: upserts at WriterTxnsPerSec,
	// WriterNewKeyPercent of them of new keys, the rest of random existing
	// ones, sent to the source from the start and to the destination from
	// when it joins. Without it the initiator sends only heartbeats.
	Writer bool
	// WriterTxnsPerSec is the writer's offered rate. Default 100,000.
	WriterTxnsPerSec int
	// WriterNewKeyPercent: default 10.
	WriterNewKeyPercent int
	// Warmup runs the writer before BeforeWindow starts, and BeforeWindow
	// is how long the source's write rate is measured before the rejoin.
	// Defaults 200 ms and 1 s; unused without the writer.
	Warmup, BeforeWindow time.Duration

	// Codec compresses every frame on the link.
	Codec wire.Codec
	// BlockBytesMax bounds a block's tuple bytes. Default cow's, 256 KiB.
	BlockBytesMax int
	// WindowBlocksMax bounds the unacknowledged blocks. Default recovery's,
	// 16.
	WindowBlocksMax int
	// HandoffLogBytesMax and RoundsMax decide when catch-up ends and the
	// handoff starts (see recovery.SourceConfig). Defaults recovery's.
	HandoffLogBytesMax, RoundsMax int
	// StallTicksMax is both sides' stall window. Default 1000 (1 s): a
	// benchmark on a shared machine must not fail because a goroutine
	// waited for a core; stall detection is tested elsewhere.
	StallTicksMax int
	// Tick is the wall time of one tick of both processors and the
	// initiator. Default 1 ms.
	Tick time.Duration
	// LinkFramesMax bounds each direction of the link (frames in flight
	// plus frames waiting to be sent). Default WindowBlocksMax + 1024: the
	// window bounds the blocks, the rest is room for acks and heartbeats.
	LinkFramesMax int

	// Timeout bounds the whole run. Default 1 min + 1 s per 50,000 rows.
	Timeout time.Duration
	// QueueTxnsMax bounds both executors' queues. Default: every txn the
	// writer can offer until Timeout (WriterTxnsPerSec × Timeout), plus
	// partition.QueueTxnsMaxDefault. The destination buffers every txn
	// from joining the feed to going live, so this makes a full buffer
	// impossible before the run times out; the queue is a heap that grows
	// as filled, so the bound costs no memory until used.
	QueueTxnsMax int
	// Seed makes the rows and the writer's choices.
	Seed uint64
}

// WithDefaults returns c with every zero field set to its default.
func (c RejoinConfig) WithDefaults() RejoinConfig {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	src := recovery.DefaultSourceConfig(wire.MsgHeader{})
	def(&c.KeyBytes, 16)
	def(&c.ValueBytes, 100)
	def(&c.WriterTxnsPerSec, 100_000)
	def(&c.WriterNewKeyPercent, 10)
	defDur(&c.Warmup, 200*time.Millisecond)
	defDur(&c.BeforeWindow, time.Second)
	def(&c.BlockBytesMax, src.Stream.BlockBytesMax)
	def(&c.WindowBlocksMax, src.WindowBlocksMax)
	def(&c.HandoffLogBytesMax, src.HandoffLogBytesMax)
	def(&c.RoundsMax, src.RoundsMax)
	def(&c.StallTicksMax, 1000)
	defDur(&c.Tick, time.Millisecond)
	def(&c.LinkFramesMax, c.WindowBlocksMax+1024)
	defDur(&c.Timeout, time.Minute+time.Duration(c.Rows/50_000)*time.Second)
	if c.QueueTxnsMax == 0 {
		c.QueueTxnsMax = partition.QueueTxnsMaxDefault
		if c.Writer {
			c.QueueTxnsMax += int(float64(c.WriterTxnsPerSec) * c.Timeout.Seconds())
		}
	}
	return c
}

// Validate checks a config after WithDefaults.
func (c RejoinConfig) Validate() error {
	switch {
	case c.Rows < 1:
		return fmt.Errorf("bench: Rows %d, want >= 1", c.Rows)
	case c.KeyBytes < keyBytesMin:
		return fmt.Errorf("bench: KeyBytes %d, want >= %d", c.KeyBytes, keyBytesMin)
	case c.ValueBytes < 0:
		return fmt.Errorf("bench: ValueBytes %d, want >= 0", c.ValueBytes)
	case c.WriterTxnsPerSec < 1:
		return fmt.Errorf("bench: WriterTxnsPerSec %d, want >= 1", c.WriterTxnsPerSec)
	case c.WriterNewKeyPercent < 0 || c.WriterNewKeyPercent > 100:
		return fmt.Errorf("bench: WriterNewKeyPercent %d, want 0..100", c.WriterNewKeyPercent)
	case c.Warmup < 0 || c.BeforeWindow <= 0 || c.Tick <= 0 || c.Timeout <= 0:
		return fmt.Errorf("bench: Warmup %v, BeforeWindow %v, Tick %v, Timeout %v: want >= 0, > 0, > 0, > 0", c.Warmup, c.BeforeWindow, c.Tick, c.Timeout)
	case !c.Codec.Valid():
		return fmt.Errorf("bench: codec %v", c.Codec)
	case c.LinkFramesMax <= c.WindowBlocksMax:
		return fmt.Errorf("bench: LinkFramesMax %d, want > WindowBlocksMax %d", c.LinkFramesMax, c.WindowBlocksMax)
	case c.QueueTxnsMax < 1:
		return fmt.Errorf("bench: QueueTxnsMax %d, want >= 1", c.QueueTxnsMax)
	}
	if err := c.sourceConfig().Validate(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := c.destinationConfig().Validate(); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

var benchHeader = wire.MsgHeader{Epoch: 1, Partition: 1}

func (c RejoinConfig) sourceConfig() recovery.SourceConfig {
	s := recovery.DefaultSourceConfig(benchHeader)
	s.WindowBlocksMax = c.WindowBlocksMax
	s.StallTicksMax = c.StallTicksMax
	s.HandoffLogBytesMax = c.HandoffLogBytesMax
	s.RoundsMax = c.RoundsMax
	s.Stream.BlockBytesMax = c.BlockBytesMax
	return s
}

func (c RejoinConfig) destinationConfig() recovery.DestinationConfig {
	return recovery.DestinationConfig{
		Header:         benchHeader,
		Initiators:     []txnid.Initiator{benchInitiator},
		StallTicksMax:  c.StallTicksMax,
		HeartbeatTicks: recovery.DefaultSourceConfig(benchHeader).HeartbeatTicks,
	}
}

// RejoinResult is what one run measured. Rates are per wall second; MB is
// 10^6 bytes, as in Go's MB/s.
type RejoinResult struct {
	// Rows is the rows the destination held when it went live: the
	// partition's size, the figure a "rejoin of N rows" means.
	Rows int
	// StreamedRows counts every row shipped: the snapshot's, then the
	// catch-up rounds' upserts and deletes (rows written behind the
	// cursor travel twice). Bytes counts their tuple bytes, WireBytes the
	// frame bytes of every message from source to destination (after the
	// codec, headers included), and Blocks the blocks.
	StreamedRows      int64
	Bytes, WireBytes  int64
	Blocks            int64
	SnapshotRows      int64
	CatchUpRows       int64
	Seconds           float64 // from the start of the rejoin to the destination live
	RowsPerSec        float64 // Rows / Seconds
	MBPerSec          float64 // Bytes / Seconds
	WireMBPerSec      float64 // WireBytes / Seconds
	HandoffPause      time.Duration
	HandoffPauseTicks uint64
	Rounds            int
	LogBytesPeak      int
	ThrottledTicks    int64
	// WritesBeforePerSec is the txns the source executed per second over
	// BeforeWindow, WritesDuringPerSec from the start of the rejoin to the
	// source's handoff, and WriteRatio their ratio. WriterOfferedPerSec is
	// the rate the writer actually offered during the rejoin: if it is
	// below the configured rate, the machine could not even run the writer
	// and the ratio measures that too. All zero without the writer.
	WritesBeforePerSec, WritesDuringPerSec, WriteRatio float64
	WriterOfferedPerSec                                float64
	// SourceQueuePeak is the most txns queued at the source during the
	// rejoin.
	SourceQueuePeak int
	// TxnsBuffered is what the destination had buffered at E and executed
	// after going live; TxnsDropped what it dropped as below E at the
	// handoff, and TxnsLate the txns below E that reached it only after
	// (its feed lagged the source's), dropped as well.
	TxnsBuffered, TxnsDropped, TxnsLate int
	// CommonTxnID is the txn both replicas last executed when their
	// digests were compared, Digest the digest they agreed on, and
	// FinalRows their rows then.
	CommonTxnID txnid.ID
	Digest      uint64
	FinalRows   int
}

// Rejoin is one prepared run: the source partition is loaded, nothing
// runs yet. It runs once.
type Rejoin struct {
	cfg   RejoinConfig
	shape *rowShape
	src   *partition.Partition
	// onLive is for tests: see destinationDriver.onLive.
	onLive func(*partition.Partition)
}

// NewRejoin checks cfg and loads the source partition. It is the part of
// a run not to measure.
func NewRejoin(cfg RejoinConfig) (*Rejoin, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	shape := newRowShape(cfg.KeyBytes, cfg.ValueBytes, cfg.Seed)
	p, err := loadRows(shape, cfg.Rows, cfg.Seed)
	if err != nil {
		return nil, err
	}
	return &Rejoin{cfg: cfg, shape: shape, src: p}, nil
}

// Config returns the run's config, defaults filled in.
func (r *Rejoin) Config() RejoinConfig { return r.cfg }

// RunRejoin loads and runs one rejoin; see Rejoin.Run.
func RunRejoin(ctx context.Context, cfg RejoinConfig) (RejoinResult, error) {
	r, err := NewRejoin(cfg)
	if err != nil {
		return RejoinResult{}, err
	}
	return r.Run(ctx)
}

// errRunOnce: a Rejoin's source partition is changed by its run.
var errRunOnce = errors.New("bench: a Rejoin runs once")

// Run runs the rejoin: it starts the initiator and the source's driver,
// measures the source's write rate, starts the destination's driver and
// the rejoin, waits for the destination to go live, stops the writer,
// lets both replicas execute everything sent, and compares their digests
// at the same last txn. A mismatch, an abort, a timeout or a stuck driver
// is an error. Every goroutine it started has ended when it returns.
func (r *Rejoin) Run(ctx context.Context) (RejoinResult, error) {
	if r.src == nil {
		return RejoinResult{}, errRunOnce
	}
	cfg := r.cfg
	srcPart := r.src
	r.src = nil // the drivers own it now; the collector may have it after

	ctx, cancelTimeout := context.WithTimeout(ctx, cfg.Timeout)
	defer cancelTimeout()
	g := newGroup(ctx)
	defer g.stop()

	// Each feed holds up to 256 batches, a quarter of a second of ticks:
	// room for a replica busy applying a block, so that the initiator
	// rarely waits on one replica, which would delay the other's feed too.
	const feedBatchesMax = 256
	toSourceFeed := make(chan *batch, feedBatchesMax)
	join := make(chan chan<- *batch, 1)
	stopWriter := make(chan struct{})
	start := make(chan struct{})
	down, up := newLink(cfg.LinkFramesMax), newLink(cfg.LinkFramesMax)
	execCfg := partition.ExecutorConfig{QueueTxnsMax: cfg.QueueTxnsMax}

	src := &sourceDriver{
		replica: newReplica("source", toSourceFeed, up, down, cfg),
		cfg:     cfg.sourceConfig(),
		start:   start,
		done:    make(chan struct{}),
	}
	srcExec := partition.NewExecutor(srcPart, partition.NewBuiltinRegistry(), execCfg)
	srcCore, err := recovery.NewReplica(recovery.ReplicaConfig{Partition: benchHeader.Partition, Live: true, DropResults: true,
		NewExecutor: func() (*partition.Executor, error) { return srcExec, nil }})
	if err != nil {
		return RejoinResult{}, err
	}
	srcCore.AddInitiator(benchInitiator)
	src.core, src.exec = srcCore, srcExec
	dst := &destinationDriver{
		replica:   newReplica("destination", nil, down, up, cfg),
		cfg:       cfg.destinationConfig(),
		execCfg:   execCfg,
		initiator: join,
		feedIn:    make(chan *batch, feedBatchesMax),
		live:      make(chan struct{}),
		onLive:    r.onLive,
	}
	dst.feed = dst.feedIn
	in, err := newInitiator(cfg, r.shape, toSourceFeed, join, stopWriter)
	if err != nil {
		return RejoinResult{}, err
	}
	g.spawn(in.run)
	g.spawn(src.run)

	var res RejoinResult
	if cfg.Writer {
		if err := g.sleep(cfg.Warmup); err != nil {
			return res, err
		}
		n0, t0 := src.executed.Load(), time.Now()
		if err := g.sleep(cfg.BeforeWindow); err != nil {
			return res, err
		}
		res.WritesBeforePerSec = float64(src.executed.Load()-n0) / time.Since(t0).Seconds()
	}

	// The rejoin: the source gets ready to answer, then the destination
	// joins the feed and proposes.
	n0, o0, t0 := src.executed.Load(), in.offered.Load(), time.Now()
	close(start)
	g.spawn(dst.run)
	if err := g.wait(src.done); err != nil {
		return res, err
	}
	if cfg.Writer {
		res.WriterOfferedPerSec = float64(in.offered.Load()-o0) / time.Since(t0).Seconds()
	}
	if err := g.wait(dst.live); err != nil {
		return res, err
	}
	if cfg.Writer {
		res.WritesDuringPerSec = float64(src.executedAtDone-n0) / src.doneAt.Sub(t0).Seconds()
		res.WriteRatio = res.WritesDuringPerSec / res.WritesBeforePerSec
	}

	// Stop the writer; both replicas execute everything up to the fence.
	close(stopWriter)
	if err := g.wait(src.finalDone); err != nil {
		return res, err
	}
	if err := g.wait(dst.finalDone); err != nil {
		return res, err
	}
	a, b := src.final, dst.final
	switch {
	case a.last != a.fence || b.last != b.fence || a.fence != b.fence:
		return res, fmt.Errorf("bench: replicas not at the fence: source at %v (fence %v), destination at %v (fence %v)", a.last, a.fence, b.last, b.fence)
	case a.digest != b.digest || a.rows != b.rows:
		return res, fmt.Errorf("bench: digest mismatch at %v: source %016x with %d rows, destination %016x with %d rows", a.last, a.digest, a.rows, b.digest, b.rows)
	}
	res.CommonTxnID, res.Digest, res.FinalRows = a.last, a.digest, a.rows
	// Stop everything before the figures, so that nothing still runs when
	// the caller reads them.
	if err := g.stop(); err != nil {
		return res, err
	}
	res.fill(cfg, src, dst, t0)
	return res, nil
}

// fill computes the rejoin's figures from what the drivers published.
func (res *RejoinResult) fill(cfg RejoinConfig, src *sourceDriver, dst *destinationDriver, t0 time.Time) {
	m := src.metrics
	all := []cow.Counts{m.Snapshot, m.Deletes, m.Upserts}
	for _, c := range all {
		res.StreamedRows += c.Rows
		res.Bytes += c.Bytes
		res.Blocks += c.Blocks
	}
	res.SnapshotRows = m.Snapshot.Rows
	res.CatchUpRows = m.Deletes.Rows + m.Upserts.Rows
	res.WireBytes = src.wireBytes
	res.Rows = dst.rows
	res.Seconds = dst.liveAt.Sub(t0).Seconds()
	res.RowsPerSec = float64(res.Rows) / res.Seconds
	res.MBPerSec = float64(res.Bytes) / 1e6 / res.Seconds
	res.WireMBPerSec = float64(res.WireBytes) / 1e6 / res.Seconds
	res.HandoffPause = src.releasedAt.Sub(src.holdAt)
	res.HandoffPauseTicks = m.HandoffPauseTicks
	res.Rounds = m.Rounds
	res.LogBytesPeak = m.LogBytesPeak
	res.ThrottledTicks = m.ThrottledTicks
	res.SourceQueuePeak = src.queuePeak
	res.TxnsBuffered = dst.backlog
	res.TxnsDropped = dst.metrics.TxnsDropped
	res.TxnsLate = dst.proc.Metrics().TxnsLate
}

// group runs the drivers: the first error cancels the others, and stop
// waits for all of them. A goroutine that ends because the context ended
// returns nil: it was told to.
type group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	err error
}

func newGroup(parent context.Context) *group {
	ctx, cancel := context.WithCancel(parent)
	return &group{ctx: ctx, cancel: cancel}
}

func (g *group) spawn(f func(context.Context) error) {
	g.wg.Go(func() {
		if err := f(g.ctx); err != nil {
			g.mu.Lock()
			if g.err == nil {
				g.err = err
			}
			g.mu.Unlock()
			g.cancel()
		}
	})
}

// stop cancels every goroutine, waits for them and returns the first
// error. Calling it again returns the same.
func (g *group) stop() error {
	g.cancel()
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// failure returns why the group's context ended: a goroutine's error, or
// the parent's (timeout, cancellation).
func (g *group) failure() error {
	if err := g.stop(); err != nil {
		return err
	}
	return fmt.Errorf("bench: rejoin run: %w", context.Cause(g.ctx))
}

// wait waits for ch to be closed, or fails as the group does.
func (g *group) wait(ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-g.ctx.Done():
		return g.failure()
	}
}

func (g *group) sleep(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-g.ctx.Done():
		return g.failure()
	}
}
