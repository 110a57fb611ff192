package load

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// Config of a load run.
type Config struct {
	// Table is the kv table written: a bytes key and a bytes value.
	// Default "kv".
	Table string
	// Rate is the offered txns per second; 0 means as fast as Concurrency
	// callers go. Offers that find every caller busy are counted as
	// Missed, not queued.
	Rate float64
	// Concurrency is the number of callers; default 16.
	Concurrency int
	// Duration of the run; 0 means until the context ends or Stop.
	Duration time.Duration
	// Writes bounds the writes the run issues; the run ends once they are
	// all answered (or uncertain). 0: no bound.
	Writes int64
	// KeyBytes and ValueBytes shape rows; default 16 and 100.
	KeyBytes, ValueBytes int
	// Keys is the existing key space: rows 0..Keys-1 (as Load made them).
	Keys int
	// NewKeyFraction of the writes go to new rows (Keys, Keys+1, ...);
	// the rest to a random row already in the key space.
	NewKeyFraction float64
	// Record keeps every acknowledged write (Report.Acked) and every
	// uncertain one (Report.Maybe).
	Record bool
	// Seed makes the key choice repeatable; 0 picks one from the clock.
	Seed uint64
}

func (cfg *Config) defaults() error {
	if cfg.Table == "" {
		cfg.Table = "kv"
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.KeyBytes <= 0 {
		cfg.KeyBytes = 16
	}
	if cfg.ValueBytes <= 0 {
		cfg.ValueBytes = 100
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	switch {
	case cfg.Rate < 0:
		return fmt.Errorf("load: negative rate %v", cfg.Rate)
	case cfg.Writes < 0:
		return fmt.Errorf("load: negative write count %d", cfg.Writes)
	case cfg.Keys < 0:
		return fmt.Errorf("load: negative key space %d", cfg.Keys)
	case cfg.NewKeyFraction < 0 || cfg.NewKeyFraction > 1:
		return fmt.Errorf("load: new key fraction %v outside [0, 1]", cfg.NewKeyFraction)
	case cfg.KeyBytes < KeyBytesMin:
		return fmt.Errorf("load: keys of %d bytes, at least %d", cfg.KeyBytes, KeyBytesMin)
	}
	return nil
}

// Snapshot is a running generator's cumulative counts at one moment. Two
// snapshots give the figures of the interval between them (Since).
type Snapshot struct {
	At                      time.Time
	Txns, Errors, Uncertain int64
	Missed                  int64
	Hist                    Histogram
}

// Window is the figures of an interval of a run; latencies in ms.
type Window struct {
	Seconds                 float64
	Txns, Errors, Uncertain int64
	Missed                  int64
	TxnsPerSec              float64
	P50, P90, P99, P999     float64
	Max                     float64
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func window(seconds float64, txns, errs, unc, missed int64, h *Histogram) Window {
	w := Window{Seconds: seconds, Txns: txns, Errors: errs, Uncertain: unc, Missed: missed,
		P50: ms(h.Quantile(0.5)), P90: ms(h.Quantile(0.9)), P99: ms(h.Quantile(0.99)),
		P999: ms(h.Quantile(0.999)), Max: ms(h.Max())}
	if seconds > 0 {
		w.TxnsPerSec = float64(txns) / seconds
	}
	return w
}

// Since returns the figures of the interval from earlier to s.
func (s Snapshot) Since(earlier Snapshot) Window {
	h := s.Hist.Sub(&earlier.Hist)
	return window(s.At.Sub(earlier.At).Seconds(), s.Txns-earlier.Txns, s.Errors-earlier.Errors,
		s.Uncertain-earlier.Uncertain, s.Missed-earlier.Missed, &h)
}

// Report is a whole run's figures.
type Report struct {
	Window
	// Hist is the run's latency histogram.
	Hist Histogram
	// KeySpace is the rows the run may have written: 0..KeySpace-1.
	KeySpace uint64
	// LastError is the text of the last failed or uncertain write.
	LastError string
	// Acked (with Config.Record): key -> the value of its acknowledged
	// write with the highest txn ID, which is the value a replica holds
	// unless an uncertain write (Maybe) came after it.
	Acked map[string][]byte
	// AckedID (with Config.Record): key -> the txn ID of that write, so
	// that a lost one says when, and through which initiator, it was
	// acknowledged.
	AckedID map[string]txnid.ID
	// Maybe (with Config.Record): key -> values of uncertain writes.
	Maybe map[string][][]byte
}

type ack struct {
	id    txnid.ID
	value []byte
}

// shard is one caller's counts, locked only against Snapshot.
type shard struct {
	mu        sync.Mutex
	hist      Histogram
	txns      int64
	errs      int64
	uncertain int64
	lastErr   string
	acked     map[string]ack
	maybe     map[string][][]byte
}

// Put is one write of a Generator: value under key in table. It returns
// the ID of the txn that made it, Zero for a store that has none (then
// Config.Record cannot order a key's writes: leave it off), or an error;
// one wrapping client.ErrUncertain counts the write uncertain, any other
// failed.
type Put func(ctx context.Context, table string, key, value []byte) (txnid.ID, error)

// ClientPut is the Put of a rejoin cluster: an upsert through c.
func ClientPut(c *client.Client) Put {
	return func(ctx context.Context, table string, key, value []byte) (txnid.ID, error) {
		res, err := c.Upsert(ctx, table, wire.Bytes(key), wire.Bytes(value))
		return res.ID, err
	}
}

// Generator is a running load.
type Generator struct {
	put    Put
	cfg    Config
	start  time.Time
	cancel context.CancelFunc
	done   chan struct{}
	ctxErr error // the caller's context ended the run early

	shards  []*shard
	nextKey atomic.Uint64
	version atomic.Uint64
	issued  atomic.Int64 // writes issued, against Config.Writes
	missed  atomic.Int64
	// lastAck is when the latest write was acknowledged (Unix
	// nanoseconds, 0 before the first), gapMax the longest time between
	// two acknowledgements since TakeGapMax.
	lastAck, gapMax atomic.Int64
}

// noteAck counts the time since the acknowledgement before this one.
func (g *Generator) noteAck(now time.Time) {
	at := now.UnixNano()
	prev := g.lastAck.Swap(at)
	if prev == 0 {
		return
	}
	for d := at - prev; ; {
		m := g.gapMax.Load()
		if d <= m || g.gapMax.CompareAndSwap(m, d) {
			return
		}
	}
}

// TakeGapMax returns the longest time between two acknowledged writes
// that ended since the last call (or the start), and starts the count
// again: the longest a fault kept every caller from being served.
func (g *Generator) TakeGapMax() time.Duration { return time.Duration(g.gapMax.Swap(0)) }

// Start starts a load through c; stop it with Stop or Wait.
func Start(ctx context.Context, c *client.Client, cfg Config) (*Generator, error) {
	return StartPut(ctx, ClientPut(c), cfg)
}

// StartPut starts a load whose writes go through put: the same offered
// load against another store (rejoin bench --redis).
func StartPut(ctx context.Context, put Put, cfg Config) (*Generator, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	g := &Generator{put: put, cfg: cfg, done: make(chan struct{}), start: time.Now()}
	g.nextKey.Store(uint64(cfg.Keys))
	var runCtx context.Context
	var cancel context.CancelFunc
	if cfg.Duration > 0 {
		runCtx, cancel = context.WithTimeout(ctx, cfg.Duration)
	} else {
		runCtx, cancel = context.WithCancel(ctx)
	}
	g.cancel = cancel
	var tokens chan struct{}
	var wg sync.WaitGroup
	if cfg.Rate > 0 {
		// Room for two ticks of offers, so a tick's burst is not missed
		// while callers are free.
		tokens = make(chan struct{}, max(cfg.Concurrency, min(2*int(cfg.Rate*paceStep(cfg.Rate).Seconds()+1), 1<<16)))
		wg.Go(func() { g.pace(runCtx, tokens) })
	}
	for i := range cfg.Concurrency {
		s := &shard{}
		if cfg.Record {
			s.acked, s.maybe = make(map[string]ack), make(map[string][][]byte)
		}
		g.shards = append(g.shards, s)
		wg.Go(func() { g.write(runCtx, ctx, s, tokens, rand.New(rand.NewPCG(cfg.Seed, uint64(i)))) })
	}
	go func() {
		wg.Wait()
		if ctx.Err() != nil && cfg.Duration > 0 && time.Since(g.start) < cfg.Duration {
			g.ctxErr = ctx.Err()
		}
		cancel()
		close(g.done)
	}()
	return g, nil
}

// Run runs a load for cfg.Duration (or until ctx ends) and reports it.
// It fails only on a bad config, or with ctx's error if ctx ended the run
// before its Duration.
func Run(ctx context.Context, c *client.Client, cfg Config) (Report, error) {
	g, err := Start(ctx, c, cfg)
	if err != nil {
		return Report{}, err
	}
	return g.Wait()
}

// paceStep is the pacer's tick: one offer's interval, within [1 ms, 100 ms].
func paceStep(rate float64) time.Duration {
	return min(max(time.Duration(float64(time.Second)/rate), time.Millisecond), 100*time.Millisecond)
}

// pace offers Rate tokens per second, those due at each tick.
func (g *Generator) pace(ctx context.Context, tokens chan<- struct{}) {
	t := time.NewTicker(paceStep(g.cfg.Rate))
	defer t.Stop()
	var offered int64
	for {
		elapsed := time.Since(g.start)
		if g.cfg.Duration > 0 {
			elapsed = min(elapsed, g.cfg.Duration)
		}
		due := int64(elapsed.Seconds() * g.cfg.Rate)
		for ; offered < due; offered++ {
			select {
			case tokens <- struct{}{}:
			default:
				g.missed.Add(1)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// write issues writes until runCtx ends; a call in flight then completes
// under callCtx (the caller's), so the end of a run makes no write
// uncertain.
func (g *Generator) write(ctx, callCtx context.Context, s *shard, tokens <-chan struct{}, rng *rand.Rand) {
	cfg := &g.cfg
	for {
		if tokens != nil {
			select {
			case <-tokens:
			case <-ctx.Done():
				return
			}
		} else if ctx.Err() != nil {
			return
		}
		if cfg.Writes > 0 && g.issued.Add(1) > cfg.Writes {
			g.cancel() // the pacer stops too, and the run ends
			return
		}
		var i uint64
		if space := g.nextKey.Load(); space == 0 || rng.Float64() < cfg.NewKeyFraction {
			i = g.nextKey.Add(1) - 1
		} else {
			i = rng.Uint64N(space)
		}
		ver := g.version.Add(1)
		key := Key(i, cfg.KeyBytes)
		val := Value(i, ver, cfg.ValueBytes)
		t0 := time.Now()
		id, err := g.put(callCtx, cfg.Table, key, val)
		end := time.Now()
		lat := end.Sub(t0)
		if err != nil && callCtx.Err() != nil && !errors.Is(err, client.ErrUncertain) {
			return // the caller's context ended before the call went out
		}
		s.mu.Lock()
		switch {
		case err == nil:
			g.noteAck(end)
			s.txns++
			s.hist.Record(lat)
			if s.acked != nil {
				if a, ok := s.acked[string(key)]; !ok || id > a.id {
					s.acked[string(key)] = ack{id, val}
				}
			}
		case errors.Is(err, client.ErrUncertain):
			s.uncertain++
			s.lastErr = err.Error()
			if s.maybe != nil {
				s.maybe[string(key)] = append(s.maybe[string(key)], val)
			}
		default:
			s.errs++
			s.lastErr = err.Error()
		}
		s.mu.Unlock()
	}
}

// Snapshot returns the cumulative counts so far.
func (g *Generator) Snapshot() Snapshot {
	sn := Snapshot{At: time.Now(), Missed: g.missed.Load()}
	for _, s := range g.shards {
		s.mu.Lock()
		sn.Txns += s.txns
		sn.Errors += s.errs
		sn.Uncertain += s.uncertain
		sn.Hist.Merge(&s.hist)
		s.mu.Unlock()
	}
	return sn
}

// Done is closed when the run has ended.
func (g *Generator) Done() <-chan struct{} { return g.done }

// Stop ends the run now and reports it.
func (g *Generator) Stop() Report {
	g.cancel()
	r, _ := g.Wait()
	return r
}

// Wait waits for the run to end (Duration, the context, or Stop) and
// reports it.
func (g *Generator) Wait() (Report, error) {
	<-g.done
	end := time.Now()
	sn := g.Snapshot()
	r := Report{
		Window:   window(end.Sub(g.start).Seconds(), sn.Txns, sn.Errors, sn.Uncertain, sn.Missed, &sn.Hist),
		Hist:     sn.Hist,
		KeySpace: g.nextKey.Load(),
	}
	if g.cfg.Record {
		r.Acked, r.Maybe, r.AckedID = make(map[string][]byte), make(map[string][][]byte), make(map[string]txnid.ID)
		for _, s := range g.shards {
			for k, a := range s.acked {
				if id, ok := r.AckedID[k]; !ok || a.id > id {
					r.AckedID[k], r.Acked[k] = a.id, a.value
				}
			}
			for k, vs := range s.maybe {
				r.Maybe[k] = append(r.Maybe[k], vs...)
			}
		}
	}
	for _, s := range g.shards {
		if s.lastErr != "" {
			r.LastError = s.lastErr
		}
	}
	return r, g.ctxErr
}
