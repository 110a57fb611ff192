package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/client/clienttest"
	"github.com/rejoin-db/rejoin/wire"
)

func kv(k, v string) []wire.Value { return []wire.Value{wire.Bytes([]byte(k)), wire.Bytes([]byte(v))} }

func TestUpsertReadDigests(t *testing.T) {
	checkLeaks(t)
	v := newEnv(t, 4, 2, nil)
	c := v.open(t, Options{})
	ctx := testCtx(t, 20*time.Second)
	if c.Partitions() != 4 || len(c.Tables()) != 1 || c.Tables()[0].Name != "kv" {
		t.Fatalf("cluster: %d partitions, tables %+v", c.Partitions(), c.Tables())
	}
	if got := c.Nodes(); len(got) != 2 || got[0] != "n1" || got[1] != "n2" {
		t.Fatalf("nodes %v", got)
	}
	for i := range 20 {
		k := fmt.Sprintf("key-%d", i)
		res, err := c.Upsert(ctx, "kv", kv(k, "v-"+k)...)
		if err != nil {
			t.Fatal(err)
		}
		if res.ID == 0 {
			t.Fatal("no txn id")
		}
	}
	for i := range 20 {
		k := fmt.Sprintf("key-%d", i)
		row, err := c.Read(ctx, "kv", wire.Bytes([]byte(k)))
		if err != nil {
			t.Fatal(err)
		}
		if len(row) != 2 || string(row[1].Bytes) != "v-"+k {
			t.Fatalf("read %s: %v", k, row)
		}
		// The row lives where Partition routes it.
		p := c.Partition(wire.Bytes([]byte(k)))
		rows, err := v.cluster.Rows(p, "kv")
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range rows {
			found = found || bytes.Equal(r[0].Bytes, []byte(k))
		}
		if !found {
			t.Fatalf("key %s not in partition %d", k, p)
		}
	}
	// Round-robin: both nodes served.
	if v.nodes[0].Calls() == 0 || v.nodes[1].Calls() == 0 {
		t.Fatalf("calls per node %d, %d", v.nodes[0].Calls(), v.nodes[1].Calls())
	}
	ds, err := c.Digests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := int64(0)
	for p := range uint32(4) {
		each := ds[p]
		if len(each) != 2 || each[0].Node != "r1" || len(each[0].Out) != 2 || !each[0].Out[0].Equal(each[1].Out[0]) {
			t.Fatalf("partition %d digests %+v", p, each)
		}
		total += each[0].Out[1].Int
	}
	if total != 20 {
		t.Fatalf("digest rows %d, want 20", total)
	}
}

func TestUpsertMany(t *testing.T) {
	checkLeaks(t)
	v := newEnv(t, 3, 1, nil)
	c := v.open(t, Options{})
	ctx := testCtx(t, 20*time.Second)
	const n = 2000
	rows := make([][]wire.Value, n)
	for i := range rows {
		rows[i] = kv(fmt.Sprintf("k%05d", i), fmt.Sprintf("v%d", i))
	}
	if err := c.UpsertMany(ctx, "kv", rows); err != nil {
		t.Fatal(err)
	}
	got := 0
	for p := range uint32(3) {
		rs, err := v.cluster.Rows(p, "kv")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if c.Partition(r[0]) != p {
				t.Fatalf("row %s in partition %d", r[0].Bytes, p)
			}
		}
		got += len(rs)
	}
	if got != n {
		t.Fatalf("%d rows, want %d", got, n)
	}
	// At least ceil(rows per partition / 256) calls each, few more.
	if calls := v.nodes[0].Calls(); calls < n/UpsertManyRowsMax || calls > n/UpsertManyRowsMax+3+1 {
		t.Fatalf("%d calls for %d rows", calls, n)
	}
}

// TestPipelining: one connection carries many calls at once; a slow reply
// does not hold the later ones, which come back first.
func TestPipelining(t *testing.T) {
	checkLeaks(t)
	slow := []byte("slow")
	hook := func(_ string, call *wire.Call) (clienttest.Action, time.Duration) {
		if bytes.Contains(call.Params, slow) {
			return clienttest.Answer, 1500 * time.Millisecond
		}
		return clienttest.Answer, 0
	}
	v := newEnv(t, 2, 1, hook)
	c := v.open(t, Options{PipelineMax: 64})
	ctx := testCtx(t, 20*time.Second)
	if _, err := c.Upsert(ctx, "kv", kv("warm", "x")...); err != nil {
		t.Fatal(err)
	}
	slowDone := make(chan time.Time, 1)
	go func() {
		_, err := c.Upsert(ctx, "kv", kv("slow", "x")...)
		if err != nil {
			t.Error(err)
		}
		slowDone <- time.Now()
	}()
	time.Sleep(50 * time.Millisecond) // the slow call goes first
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if _, err := c.Upsert(ctx, "kv", kv(fmt.Sprintf("fast%d", i), "x")...); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	fastDone := time.Now()
	t.Logf("50 fast calls took %v behind a slow one", fastDone.Sub(start))
	select {
	case s := <-slowDone:
		if s.Before(fastDone) {
			t.Errorf("the slow reply came before the fast ones")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("slow call never answered")
	}
}

// TestManyCallersOneConnection: 64 callers share one node's connection,
// whose calls go out in shared writes (a caller writes the frames that
// came in during the write before, then hands the rest to the writer
// goroutine); every call reaches the node once and every answer its own
// caller.
func TestManyCallersOneConnection(t *testing.T) {
	checkLeaks(t)
	v := newEnv(t, 2, 1, nil)
	c := v.open(t, Options{})
	ctx := testCtx(t, 30*time.Second)
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			for i := range 50 {
				k := fmt.Sprintf("key-%d-%d", g, i)
				if _, err := c.Upsert(ctx, "kv", kv(k, "v-"+k)...); err != nil {
					t.Error(err)
					return
				}
				row, err := c.Read(ctx, "kv", wire.Bytes([]byte(k)))
				if err != nil {
					t.Error(err)
					return
				}
				if len(row) != 2 || string(row[1].Bytes) != "v-"+k {
					t.Errorf("read %s: %v", k, row)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := v.nodes[0].Calls(); n != 64*50*2 {
		t.Fatalf("node got %d calls, want %d", n, 64*50*2)
	}
}

func TestErrorReply(t *testing.T) {
	checkLeaks(t)
	v := newEnv(t, 2, 1, nil)
	c := v.open(t, Options{})
	ctx := testCtx(t, 20*time.Second)
	_, err := c.Read(ctx, "kv", wire.Bytes([]byte("absent")))
	if !errors.Is(err, ErrProcedure) || !errors.Is(err, ErrNotFound) || errors.Is(err, ErrUncertain) {
		t.Fatalf("read of absent key: %v", err)
	}
	_, err = c.Call(ctx, 0, "no_such_proc", nil)
	if !errors.Is(err, ErrProcedure) || errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown proc: %v", err)
	}
	if _, err := c.Call(ctx, 7, "read", nil); err == nil {
		t.Fatal("partition out of range accepted")
	}
	// The connection is still good.
	if _, err := c.Upsert(ctx, "kv", kv("a", "b")...); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx, "kv", wire.Bytes([]byte("a"))); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := c.Delete(ctx, "kv", wire.Bytes([]byte("a"))); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete of a deleted key: %v", err)
	}
	if _, err := c.Read(ctx, "kv", wire.Bytes([]byte("a"))); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read of a deleted key: %v", err)
	}
}

// TestDropMidCall: the node executes a call and drops the connection
// unanswered: the call is uncertain (and did happen), the other calls in
// flight fail uncertain too, and the next call redials.
func TestDropMidCall(t *testing.T) {
	checkLeaks(t)
	hook := func(_ string, call *wire.Call) (clienttest.Action, time.Duration) {
		switch {
		case bytes.Contains(call.Params, []byte("drop")):
			return clienttest.DropAfter, 0
		case bytes.Contains(call.Params, []byte("hang")):
			return clienttest.Hang, 0
		}
		return clienttest.Answer, 0
	}
	v := newEnv(t, 2, 1, hook)
	c := v.open(t, Options{})
	ctx := testCtx(t, 20*time.Second)
	if _, err := c.Upsert(ctx, "kv", kv("x", "1")...); err != nil {
		t.Fatal(err)
	}
	hung := make(chan error, 1)
	go func() {
		_, err := c.Upsert(ctx, "kv", kv("hang", "1")...)
		hung <- err
	}()
	time.Sleep(50 * time.Millisecond)
	_, err := c.Upsert(ctx, "kv", kv("d", "drop")...)
	if !errors.Is(err, ErrUncertain) {
		t.Fatalf("dropped call: %v", err)
	}
	select {
	case err := <-hung:
		if !errors.Is(err, ErrUncertain) {
			t.Fatalf("call in flight on the dropped connection: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("call in flight not failed")
	}
	// The dropped write did happen (the fake executes before dropping).
	row, err := c.Read(ctx, "kv", wire.Bytes([]byte("d")))
	if err != nil || string(row[1].Bytes) != "drop" {
		t.Fatalf("read after redial: %v %v", row, err)
	}
}

// TestLostReplicasUncertain: a node that sent the txn but lost every
// replica before one answered says so; the caller gets ErrUncertain, never
// ErrProcedure ("did not commit"), since the write may have happened.
func TestLostReplicasUncertain(t *testing.T) {
	checkLeaks(t)
	hook := func(_ string, call *wire.Call) (clienttest.Action, time.Duration) {
		if bytes.Contains(call.Params, []byte("lost")) {
			return clienttest.Lost, 0
		}
		return clienttest.Answer, 0
	}
	v := newEnv(t, 2, 1, hook)
	c := v.open(t, Options{})
	ctx := testCtx(t, 20*time.Second)
	_, err := c.Upsert(ctx, "kv", kv("k", "lost")...)
	if !errors.Is(err, ErrUncertain) || errors.Is(err, ErrProcedure) {
		t.Fatalf("call whose replicas were lost: %v; want ErrUncertain only", err)
	}
	// The write did happen on the fake: uncertain means it may have.
	row, err := c.Read(ctx, "kv", wire.Bytes([]byte("k")))
	if err != nil || string(row[1].Bytes) != "lost" {
		t.Fatalf("read back: %v %v", row, err)
	}
}

func TestTimeoutUncertain(t *testing.T) {
	checkLeaks(t)
	hook := func(_ string, call *wire.Call) (clienttest.Action, time.Duration) {
		if bytes.Contains(call.Params, []byte("hang")) {
			return clienttest.Hang, 0
		}
		return clienttest.Answer, 0
	}
	v := newEnv(t, 2, 1, hook)
	c := v.open(t, Options{Timeout: 200 * time.Millisecond})
	ctx := testCtx(t, 20*time.Second)
	_, err := c.Upsert(ctx, "kv", kv("hang", "1")...)
	if !errors.Is(err, ErrUncertain) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung call: %v", err)
	}
	if _, err := c.Upsert(ctx, "kv", kv("ok", "1")...); err != nil {
		t.Fatal(err)
	}
}

// TestNodesAndFailover: Options.Nodes restricts the client; a dead node is
// skipped and one that moved is found again through its record.
func TestNodesAndFailover(t *testing.T) {
	checkLeaks(t)
	v := newEnv(t, 2, 2, nil)
	ctx := testCtx(t, 30*time.Second)
	only2 := v.open(t, Options{Nodes: []string{"n2"}})
	for i := range 10 {
		if _, err := only2.Upsert(ctx, "kv", kv(fmt.Sprint(i), "x")...); err != nil {
			t.Fatal(err)
		}
	}
	if v.nodes[0].Calls() != 0 || v.nodes[1].Calls() != 10 {
		t.Fatalf("calls %d, %d", v.nodes[0].Calls(), v.nodes[1].Calls())
	}

	c := v.open(t, Options{Timeout: 5 * time.Second})
	for i := range 4 {
		if _, err := c.Upsert(ctx, "kv", kv(fmt.Sprint(i), "y")...); err != nil {
			t.Fatal(err)
		}
	}
	// n1 dies (record still there): calls go to n2, some may be uncertain
	// if they were in flight, none fails otherwise.
	v.nodes[0].Close()
	for i := range 20 {
		if _, err := c.Upsert(ctx, "kv", kv(fmt.Sprint(i), "z")...); err != nil && !errors.Is(err, ErrUncertain) {
			t.Fatalf("call %d with n1 down: %v", i, err)
		}
	}
	// n1 comes back on a new address: the client finds it.
	n1, err := clienttest.StartNode(v.cluster, "n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n1.Close)
	if err := clienttest.RegisterNode(ctx, v.cli, "n1", n1.Addr()); err != nil {
		t.Fatal(err)
	}
	only1 := v.open(t, Options{Nodes: []string{"n1"}, Timeout: 5 * time.Second})
	deadline := time.Now().Add(10 * time.Second)
	for n1.Calls() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("restarted n1 never called")
		}
		_, _ = c.Upsert(ctx, "kv", kv("again", "1")...)
	}
	if _, err := only1.Upsert(ctx, "kv", kv("n1", "1")...); err != nil {
		t.Fatal(err)
	}
	// Every node gone: ErrNoNode once the broken connections are seen
	// (a call racing a connection's close is uncertain), never a hang.
	n1.Close()
	v.nodes[1].Close()
	for i := 0; ; i++ {
		_, err = c.Upsert(ctx, "kv", kv("none", "1")...)
		if errors.Is(err, ErrNoNode) {
			break
		}
		if !errors.Is(err, ErrUncertain) || i == 4 {
			t.Fatalf("call %d with every node down: %v", i, err)
		}
	}
}

// TestClose: calls in flight fail when the client closes, later calls fail
// with ErrClosed, and no goroutine is left (checkLeaks).
func TestClose(t *testing.T) {
	checkLeaks(t)
	hook := func(_ string, call *wire.Call) (clienttest.Action, time.Duration) {
		if bytes.Contains(call.Params, []byte("hang")) {
			return clienttest.Hang, 0
		}
		return clienttest.Answer, 0
	}
	v := newEnv(t, 2, 2, hook)
	c := v.open(t, Options{})
	ctx := testCtx(t, 20*time.Second)
	for i := range 4 {
		if _, err := c.Upsert(ctx, "kv", kv(fmt.Sprint(i), "x")...); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			_, err := c.Upsert(ctx, "kv", kv(fmt.Sprint("hang", i), "x")...)
			errs <- err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrUncertain) {
				t.Fatalf("call in flight at close: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("call in flight not ended by Close")
		}
	}
	if _, err := c.Upsert(ctx, "kv", kv("after", "x")...); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after close: %v", err)
	}
}

// TestPipelineMax: a connection carries at most PipelineMax calls; one
// more waits for a slot and, if none frees in time, fails unsent.
func TestPipelineMax(t *testing.T) {
	checkLeaks(t)
	hook := func(_ string, call *wire.Call) (clienttest.Action, time.Duration) {
		if bytes.Contains(call.Params, []byte("slow")) {
			return clienttest.Answer, time.Second
		}
		return clienttest.Answer, 0
	}
	v := newEnv(t, 2, 1, hook)
	c := v.open(t, Options{PipelineMax: 2, Timeout: 3 * time.Second})
	ctx := testCtx(t, 20*time.Second)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if _, err := c.Upsert(ctx, "kv", kv(fmt.Sprint("slow", i), "x")...); err != nil {
				t.Error(err)
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := c.Upsert(short, "kv", kv("third", "x")...)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUncertain) {
		t.Fatalf("call beyond PipelineMax: %v", err)
	}
	if n := v.nodes[0].Calls(); n != 2 {
		t.Fatalf("node got %d calls, want 2", n)
	}
	// Once a slot frees, calls flow again.
	if _, err := c.Upsert(ctx, "kv", kv("fourth", "x")...); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// TestTooLargeFailsBeforeSending: a value over the node's limit for a
// call's params fails at once with ErrInvalid, never ErrUncertain: it was
// never sent. It used to go to the encoder, whose refusal broke the
// connection and made the call uncertain ("connection broken: wire: too
// large"). The connection stays whole for the next call.
func TestTooLargeFailsBeforeSending(t *testing.T) {
	checkLeaks(t)
	v := newEnv(t, 2, 1, nil)
	c := v.open(t, Options{})
	ctx := testCtx(t, 20*time.Second)
	if _, err := c.Upsert(ctx, "kv", kv("before", "1")...); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("v", 4<<20)
	_, err := c.Upsert(ctx, "kv", kv("big", big)...)
	if !errors.Is(err, ErrInvalid) || errors.Is(err, ErrUncertain) || !strings.Contains(err.Error(), "nothing was sent") {
		t.Fatalf("upsert of a 4 MiB value: %v; want ErrInvalid, nothing sent", err)
	}
	if n := v.nodes[0].Calls(); n != 1 {
		t.Fatalf("the node got %d calls, want only the first", n)
	}
	if _, err := c.Upsert(ctx, "kv", kv("after", "1")...); err != nil {
		t.Fatalf("the call after: %v", err)
	}
}

// TestRefusalCodes: a node's refusal comes with its code and maps to the
// client's own error, not ErrProcedure by its text; a refusal of the
// node's own (not registered) sends the call to the next node, and comes
// back with ErrNoNode only once every node refused it.
func TestRefusalCodes(t *testing.T) {
	checkLeaks(t)
	var refuseAll atomic.Bool
	hook := func(node string, call *wire.Call) (clienttest.Action, time.Duration) {
		if node == "n1" || refuseAll.Load() {
			return clienttest.Refuse, 0
		}
		return clienttest.Answer, 0
	}
	v := newEnv(t, 2, 2, hook)
	c := v.open(t, Options{})
	ctx := testCtx(t, 20*time.Second)
	for i := range 4 {
		if _, err := c.Upsert(ctx, "kv", kv(fmt.Sprint("k", i), "v")...); err != nil {
			t.Fatalf("upsert %d with n1 refusing, n2 not: %v", i, err)
		}
	}
	refuseAll.Store(true)
	_, err := c.Upsert(ctx, "kv", kv("k", "v")...)
	if !errors.Is(err, ErrRefused) || !errors.Is(err, ErrNotRegistered) || !errors.Is(err, ErrNoNode) || errors.Is(err, ErrProcedure) || errors.Is(err, ErrUncertain) {
		t.Fatalf("every node refusing: %v; want ErrRefused, ErrNotRegistered and ErrNoNode", err)
	}
}
