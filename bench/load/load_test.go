package load

import (
	"bytes"
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/client/clienttest"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func checkLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newClient starts etcd and a fake cluster of two nodes and returns a
// client of it.
func newClient(t *testing.T, partitions uint32, hook clienttest.Hook) (*client.Client, *clienttest.Cluster) {
	t.Helper()
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	cl, err := clienttest.NewCluster(partitions, clienttest.KVSchema())
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	if err := clienttest.WriteCluster(ctx, cli, partitions, clienttest.KVSchema()); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"n1", "n2"} {
		n, err := clienttest.StartNode(cl, id, hook)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		if err := clienttest.RegisterNode(ctx, cli, id, n.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.Open(ctx, cli, client.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, cl
}

func countRows(t *testing.T, cl *clienttest.Cluster, partitions uint32) int {
	t.Helper()
	n := 0
	for p := range partitions {
		rs, err := cl.Rows(p, "kv")
		if err != nil {
			t.Fatal(err)
		}
		n += len(rs)
	}
	return n
}

func TestKeyValue(t *testing.T) {
	seen := map[string]bool{}
	for i := range uint64(1000) {
		k := Key(i, 16)
		if len(k) != 16 || !bytes.Equal(k, Key(i, 16)) || seen[string(k)] {
			t.Fatalf("key %d: %x", i, k)
		}
		seen[string(k)] = true
		if j, ok := KeyIndex(k); !ok || j != i {
			t.Fatalf("KeyIndex(Key(%d)) = %d", i, j)
		}
	}
	if len(Key(3, 8)) != 8 || len(Key(3, 21)) != 21 {
		t.Fatal("key lengths")
	}
	v1, v2 := Value(7, 1, 100), Value(7, 2, 100)
	if len(v1) != 100 || !bytes.Equal(v1, Value(7, 1, 100)) || bytes.Equal(v1, v2) {
		t.Fatalf("values %x %x", v1, v2)
	}
	if len(Value(1, 1, 0)) != 0 || len(Value(1, 1, 13)) != 13 {
		t.Fatal("value lengths")
	}
}

func TestHistogram(t *testing.T) {
	var h Histogram
	for us := 1; us <= 10000; us++ {
		h.Record(time.Duration(us) * time.Microsecond)
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		got := float64(h.Quantile(q).Microseconds())
		if want := q * 10000; math.Abs(got-want)/want > 0.04 {
			t.Errorf("q%v = %v µs, want about %v", q, got, want)
		}
	}
	if h.Max() != 10*time.Millisecond || h.Count() != 10000 {
		t.Fatalf("max %v count %d", h.Max(), h.Count())
	}
	earlier := h
	for range 100 {
		h.Record(50 * time.Millisecond)
	}
	w := h.Sub(&earlier)
	if w.Count() != 100 || w.Quantile(0.5) < 48*time.Millisecond || w.Quantile(0.5) > 52*time.Millisecond {
		t.Fatalf("window: count %d p50 %v", w.Count(), w.Quantile(0.5))
	}
	if w.Max() < 50*time.Millisecond || w.Max() > 52*time.Millisecond {
		t.Fatalf("window max %v", w.Max())
	}
	var empty Histogram
	if empty.Quantile(0.99) != 0 {
		t.Fatal("empty quantile")
	}
}

func TestLoadRunVerify(t *testing.T) {
	checkLeaks(t)
	c, cl := newClient(t, 4, nil)
	ctx := testCtx(t, 30*time.Second)
	loaded := 0
	lr, err := LoadProgress(ctx, c, "kv", 3000, 16, 100, func(rows int) { loaded = rows })
	if err != nil || loaded != 3000 {
		t.Fatalf("load said %d rows loaded: %v", loaded, err)
	}
	if lr.Rows != 3000 || lr.RowsPerSec <= 0 || countRows(t, cl, 4) != 3000 {
		t.Fatalf("load %+v, %d rows", lr, countRows(t, cl, 4))
	}
	r, err := Run(ctx, c, Config{Concurrency: 8, Duration: 500 * time.Millisecond, Keys: 3000, NewKeyFraction: 0.1, Record: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r.Window)
	if r.Txns == 0 || r.Errors != 0 || r.Uncertain != 0 || r.TxnsPerSec <= 0 || r.P99 <= 0 || r.Max < r.P50 {
		t.Fatalf("report %+v (%s)", r.Window, r.LastError)
	}
	if len(r.Acked) == 0 || int64(len(r.Acked)) > r.Txns {
		t.Fatalf("%d acked keys for %d txns", len(r.Acked), r.Txns)
	}
	if got, want := countRows(t, cl, 4), int(r.KeySpace); got > want || got < 3000 {
		t.Fatalf("%d rows, key space %d", got, want)
	}
	// The read-back says how far it is, key by key, up to every one
	// (the demo prints it while it reads).
	var mu sync.Mutex
	reads, top := 0, 0
	vr, err := VerifyProgress(ctx, c, "kv", r, func(read, of int) {
		mu.Lock()
		defer mu.Unlock()
		reads, top = reads+1, max(top, read)
		if of != len(r.Acked) {
			t.Errorf("progress of %d keys, %d acknowledged", of, len(r.Acked))
		}
	})
	if err != nil || vr.Lost != 0 || vr.Checked != len(r.Acked) {
		t.Fatalf("verify %+v: %v", vr, err)
	}
	if reads != len(r.Acked) || top != len(r.Acked) {
		t.Fatalf("progress said %d times, up to %d, of %d keys", reads, top, len(r.Acked))
	}
	// A wrong record is caught.
	for k := range r.Acked {
		r.Acked[k] = []byte("not it")
		break
	}
	if vr, err := Verify(ctx, c, "kv", r); err != nil || vr.Lost != 1 || len(vr.Examples) != 1 || !strings.Contains(vr.Examples[0], "acknowledged as txn t") {
		t.Fatalf("verify of a wrong record %+v: %v", vr, err)
	}
}

// TestLoadBatches: batches of any size load every row once, reporting
// after each batch.
func TestLoadBatches(t *testing.T) {
	checkLeaks(t)
	c, cl := newClient(t, 4, nil)
	ctx := testCtx(t, 30*time.Second)
	var calls, last int
	r, err := LoadBatches(ctx, c, "kv", 1000, 16, 10, 300, func(rows int, took time.Duration) {
		calls++
		if rows <= last || took <= 0 {
			t.Errorf("progress %d after %d, took %s", rows, last, took)
		}
		last = rows
	})
	if err != nil || r.Rows != 1000 || calls != 4 || last != 1000 || countRows(t, cl, 4) != 1000 {
		t.Fatalf("report %+v, %v; %d calls, last %d, %d rows", r, err, calls, last, countRows(t, cl, 4))
	}
	if _, err := LoadBatches(ctx, c, "kv", 10, 16, 10, 0, nil); err == nil {
		t.Fatal("batches of 0 rows accepted")
	}
}

func TestRate(t *testing.T) {
	checkLeaks(t)
	c, _ := newClient(t, 2, nil)
	ctx := testCtx(t, 30*time.Second)
	r, err := Run(ctx, c, Config{Rate: 300, Concurrency: 4, Duration: time.Second, Keys: 100})
	if err != nil {
		t.Fatal(err)
	}
	// Paced: nowhere near as fast as it goes (thousands per second here);
	// loose below, as a loaded machine stalls callers (Missed).
	if r.Txns < 50 || r.Txns+r.Missed > 301 || r.Txns+r.Missed < 150 || r.Errors != 0 {
		t.Fatalf("offered 300/s for 1 s: %+v", r.Window)
	}
}

// TestWrites: a run bounded by a write count issues exactly that many,
// to new rows 0..n-1 when every write is a new key, with or without a
// rate, and ends by itself.
func TestWrites(t *testing.T) {
	checkLeaks(t)
	c, cl := newClient(t, 4, nil)
	ctx := testCtx(t, 30*time.Second)
	for _, rate := range []float64{0, 2000} {
		r, err := Run(ctx, c, Config{Writes: 500, Rate: rate, Concurrency: 8, NewKeyFraction: 1})
		if err != nil {
			t.Fatal(err)
		}
		if r.Txns != 500 || r.Errors != 0 || r.Uncertain != 0 || r.KeySpace != 500 {
			t.Fatalf("rate %v: %+v, key space %d (%s)", rate, r.Window, r.KeySpace, r.LastError)
		}
		if n := countRows(t, cl, 4); n != 500 {
			t.Fatalf("rate %v: %d rows", rate, n)
		}
	}
	if _, err := Start(ctx, c, Config{Writes: -1}); err == nil {
		t.Fatal("negative write count accepted")
	}
}

// TestSnapshots: two intervals of a running generator, the second slower
// (the fake node delays replies), compare as the demo compares "before"
// and "during".
func TestSnapshots(t *testing.T) {
	checkLeaks(t)
	var slow atomic.Bool
	hook := func(string, *wire.Call) (clienttest.Action, time.Duration) {
		if slow.Load() {
			return clienttest.Answer, 20 * time.Millisecond
		}
		return clienttest.Answer, 0
	}
	c, _ := newClient(t, 2, hook)
	ctx := testCtx(t, 30*time.Second)
	g, err := Start(ctx, c, Config{Rate: 400, Concurrency: 16, Keys: 10})
	if err != nil {
		t.Fatal(err)
	}
	s0 := g.Snapshot()
	time.Sleep(400 * time.Millisecond)
	s1 := g.Snapshot()
	slow.Store(true)
	time.Sleep(400 * time.Millisecond)
	s2 := g.Snapshot()
	r := g.Stop()
	before, during := s1.Since(s0), s2.Since(s1)
	t.Logf("before %+v\nduring %+v", before, during)
	if before.Txns == 0 || during.Txns == 0 || before.TxnsPerSec <= 0 {
		t.Fatalf("windows %+v %+v", before, during)
	}
	if during.P50 < 20 || before.P50 >= 20 {
		t.Fatalf("p50 before %v ms, during %v ms", before.P50, during.P50)
	}
	if r.Txns < s2.Txns || r.Seconds < 0.8 {
		t.Fatalf("report %+v after snapshot of %d txns", r.Window, s2.Txns)
	}
	select {
	case <-g.Done():
	default:
		t.Fatal("not done after Stop")
	}
}

// TestUncertainRecorded: writes whose connection drops are counted
// uncertain, recorded in Maybe, and Verify accepts either outcome.
func TestUncertainRecorded(t *testing.T) {
	checkLeaks(t)
	var calls atomic.Int64
	hook := func(string, *wire.Call) (clienttest.Action, time.Duration) {
		switch calls.Add(1) % 40 {
		case 0:
			return clienttest.DropAfter, 0
		case 20:
			return clienttest.DropBefore, 0
		}
		return clienttest.Answer, 0
	}
	c, _ := newClient(t, 2, hook)
	ctx := testCtx(t, 30*time.Second)
	r, err := Run(ctx, c, Config{Concurrency: 4, Duration: 500 * time.Millisecond, Keys: 50, Record: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.Uncertain == 0 || len(r.Maybe) == 0 || r.Txns == 0 {
		t.Fatalf("report %+v, %d maybe keys (%s)", r.Window, len(r.Maybe), r.LastError)
	}
	vr, err := Verify(ctx, c, "kv", r)
	if err != nil || vr.Lost != 0 {
		t.Fatalf("verify %+v: %v", vr, err)
	}
}

// TestVerifyRetriesRefusals: a read the node refuses without running it
// (not registered for a moment) says nothing about the key: Verify reads
// again, and counts no acknowledged write lost. It used to count every
// refused read as a missing row.
func TestVerifyRetriesRefusals(t *testing.T) {
	checkLeaks(t)
	var refusing atomic.Bool
	var refused atomic.Int64
	hook := func(_ string, call *wire.Call) (clienttest.Action, time.Duration) {
		// Each key's first two reads are refused.
		if refusing.Load() && call.Proc == partition.ProcRead && refused.Add(1) <= 2*50 {
			return clienttest.Refuse, 0
		}
		return clienttest.Answer, 0
	}
	c, _ := newClient(t, 2, hook)
	ctx := testCtx(t, 30*time.Second)
	r, err := Run(ctx, c, Config{Concurrency: 4, Duration: 300 * time.Millisecond, Keys: 50, Record: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Acked) == 0 {
		t.Fatalf("no write acknowledged (%s)", r.LastError)
	}
	refusing.Store(true)
	vr, err := Verify(ctx, c, "kv", r)
	if err != nil || vr.Lost != 0 || vr.Checked != len(r.Acked) {
		t.Fatalf("verify with refused reads %+v: %v", vr, err)
	}
	if refused.Load() == 0 {
		t.Fatal("no read was refused")
	}
}

// TestGapMax: a stretch in which no write is acknowledged, every caller
// held by the store, is the longest gap TakeGapMax gives, counted once.
func TestGapMax(t *testing.T) {
	checkLeaks(t)
	const hold = 300 * time.Millisecond
	var held atomic.Bool
	var release sync.Once
	gate := make(chan struct{})
	put := func(ctx context.Context, table string, key, value []byte) (txnid.ID, error) {
		if held.Load() {
			select {
			case <-gate:
			case <-ctx.Done():
				return txnid.Zero, ctx.Err()
			}
		}
		return txnid.Zero, nil
	}
	ctx := testCtx(t, 30*time.Second)
	g, err := StartPut(ctx, put, Config{Concurrency: 4, Keys: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	time.Sleep(50 * time.Millisecond)
	g.TakeGapMax()
	held.Store(true)
	time.Sleep(hold)
	held.Store(false)
	release.Do(func() { close(gate) })
	time.Sleep(50 * time.Millisecond)
	if d := g.TakeGapMax(); d < hold {
		t.Fatalf("gap %s, want at least the %s hold", d, hold)
	}
	if d := g.TakeGapMax(); d >= hold {
		t.Fatalf("gap %s counted again after it was taken", d)
	}
}
