package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/wire"
)

// statuses yields the given replicas' statuses, as Node.replicaStatuses.
func statuses(rs ...*ReplicaStatus) func(func(*ReplicaStatus)) {
	return func(yield func(*ReplicaStatus)) {
		for _, r := range rs {
			yield(r)
		}
	}
}

var t0 = time.Date(2026, 11, 23, 18, 0, 0, 0, time.UTC)

func at(i int) time.Time { return t0.Add(time.Duration(i) * TimelineEvery) }

// TestTimelineSamples: each pass samples every attempt under way, on both
// sides; Throttled says the throttle grew since the previous sample; an
// attempt's final phase ends its timeline, and nothing is added after.
func TestTimelineSamples(t *testing.T) {
	tl := newTimelines(100, 8)
	dst := &ReplicaStatus{Partition: 3, State: recovery.ReplicaRejoining}
	src := &ReplicaStatus{Partition: 4, State: recovery.ReplicaLive}
	steps := []struct {
		phase            string
		rows, logBytes   int64
		throttledMs      float64
		txns             uint64
		wantThrottled    bool
		srcEnded, srcErr bool
	}{
		{"streaming", 100, 10, 0, 5, false, false, false},
		{"streaming", 300, 40, 10, 9, true, false, false},
		{"catching-up", 350, 50, 10, 12, false, false, false},
		{"handing-off", 360, 50, 20, 12, true, false, false},
		{"live", 365, 50, 20, 14, false, true, true},
		{"live", 365, 50, 20, 20, false, true, true}, // ended: not sampled
	}
	for i, s := range steps {
		dst.Rejoin = &RejoinStatus{Role: "destination", Peer: "n1", Epoch: 7, Phase: s.phase, Rows: s.rows, Bytes: 10 * s.rows, Started: t0}
		srcPhase := s.phase
		if srcPhase == "live" {
			srcPhase = "aborted"
		}
		rs := RejoinStatus{Role: "source", Peer: "n2", Epoch: 9, Phase: srcPhase, Rows: s.rows, LogBytesPeak: int(s.logBytes), ThrottledMs: s.throttledMs, Started: t0}
		if s.srcEnded {
			rs.Ended, rs.Err = at(i).Add(-time.Millisecond), "aborted: test"
		}
		src.Sources = []RejoinStatus{rs}
		src.TxnsExecuted = s.txns
		tl.sample(at(i), statuses(dst, src))
	}
	got := tl.snapshot(-1, 0)
	if len(got) != 2 {
		t.Fatalf("%d timelines, want 2: %+v", len(got), got)
	}
	d, s := got[0], got[1]
	if d.Partition != 3 || d.Role != "destination" || d.Peer != "n1" || d.Epoch != 7 || !d.Started.Equal(t0) || !d.Ended.Equal(at(4)) || d.Err != "" {
		t.Errorf("destination header %+v", d)
	}
	if s.Partition != 4 || s.Role != "source" || s.Peer != "n2" || s.Epoch != 9 || !s.Ended.Equal(at(4).Add(-time.Millisecond)) || s.Err != "aborted: test" {
		t.Errorf("source header %+v", s)
	}
	if len(d.Samples) != 5 || len(s.Samples) != 5 {
		t.Fatalf("samples: destination %d, source %d, want 5 each (none after the end)", len(d.Samples), len(s.Samples))
	}
	for i, st := range steps[:5] {
		ds, ss := d.Samples[i], s.Samples[i]
		if !ds.At.Equal(at(i)) || ds.Phase != st.phase || ds.Rows != st.rows || ds.Bytes != 10*st.rows {
			t.Errorf("destination sample %d: %+v", i, ds)
		}
		if ss.LogBytesPeak != int(st.logBytes) || ss.Throttled != st.wantThrottled || ss.TxnsExecuted != st.txns || ss.ThrottledMs != st.throttledMs {
			t.Errorf("source sample %d: %+v, want %+v", i, ss, st)
		}
	}
}

// TestTimelineBounded: a timeline keeps its latest samplesMax samples,
// oldest first, and counts the rest; the recorder keeps rejoinsMax
// timelines, a new one taking an ended one's place; with every kept one
// under way, a new attempt waits, counted as untracked; an attempt that
// leaves the status unseen ends its timeline; an evicted attempt is not
// recorded again from its final status.
func TestTimelineBounded(t *testing.T) {
	tl := newTimelines(5, 3)
	rs := make([]*ReplicaStatus, 4)
	for p := range rs {
		rs[p] = &ReplicaStatus{Partition: uint32(p)}
	}
	running := func(epoch uint64, i int) *RejoinStatus {
		return &RejoinStatus{Role: "destination", Peer: "n1", Epoch: epoch, Phase: "streaming", Started: at(i)}
	}
	kept := func() (parts []string) {
		t.Helper()
		for _, x := range tl.snapshot(-1, 0) {
			parts = append(parts, fmt.Sprintf("%d/%d", x.Partition, x.Epoch))
			if len(x.Samples) > 5 {
				t.Errorf("partition %d: %d samples", x.Partition, len(x.Samples))
			}
		}
		if len(tl.by) != len(tl.order) || len(tl.order) > 3 {
			t.Fatalf("recorder holds %d timelines, %d keys", len(tl.by), len(tl.order))
		}
		return parts
	}
	// Partition 0 runs 12 passes.
	for i := range 12 {
		rs[0].Rejoin = running(1, 0)
		rs[0].Rejoin.Rows = int64(i)
		tl.sample(at(i), statuses(rs[0]))
	}
	got := tl.snapshot(0, 0)
	if len(got) != 1 || len(got[0].Samples) != 5 || got[0].Dropped != 7 {
		t.Fatalf("got %+v, want 5 samples and 7 dropped", got)
	}
	for i, s := range got[0].Samples {
		if s.Rows != int64(7+i) || !s.At.Equal(at(7+i)) {
			t.Errorf("sample %d: %+v, want rows %d", i, s, 7+i)
		}
	}
	// Partition 1's attempt ends; 2 and 3 start: 1 goes, 0 (running) stays.
	rs[1].Rejoin = running(1, 12)
	tl.sample(at(12), statuses(rs...))
	rs[1].Rejoin.Phase = "live"
	tl.sample(at(13), statuses(rs...))
	rs[2].Rejoin = running(1, 13)
	tl.sample(at(14), statuses(rs...))
	rs[3].Rejoin = running(1, 14)
	tl.sample(at(15), statuses(rs...))
	if got := kept(); !reflect.DeepEqual(got, []string{"0/1", "2/1", "3/1"}) {
		t.Fatalf("kept %v, want [0/1 2/1 3/1] (the ended one evicted, not recorded again)", got)
	}
	if last := tl.snapshot(-1, 2); len(last) != 2 || last[0].Partition != 2 || last[1].Partition != 3 {
		t.Fatalf("last 2: %+v", last)
	}
	// Every kept one under way: partition 1's next attempt waits.
	rs[1].Rejoin = running(2, 16)
	tl.sample(at(16), statuses(rs...))
	if got := kept(); !reflect.DeepEqual(got, []string{"0/1", "2/1", "3/1"}) {
		t.Fatalf("kept %v, want [0/1 2/1 3/1]", got)
	}
	if _, u := tl.snapshotUntracked(-1, 0); u != 1 {
		t.Fatalf("untracked %d, want 1", u)
	}
	rs[2].Rejoin.Phase = "live"
	tl.sample(at(17), statuses(rs...))
	tl.sample(at(18), statuses(rs...))
	if got := kept(); !reflect.DeepEqual(got, []string{"0/1", "3/1", "1/2"}) || tl.untracked != 0 {
		t.Fatalf("kept %v, untracked %d; want [0/1 3/1 1/2], 0", got, tl.untracked)
	}
	// Partition 3's attempt is superseded between two passes: its
	// timeline ends at the pass that misses it, and the new one follows.
	rs[3].Rejoin = running(2, 19)
	tl.sample(at(19), statuses(rs...))
	tl.sample(at(20), statuses(rs...))
	if got := kept(); !reflect.DeepEqual(got, []string{"0/1", "1/2", "3/2"}) {
		t.Fatalf("kept %v, want [0/1 1/2 3/2]", got)
	}
	rs[0].Rejoin = nil
	tl.sample(at(21), statuses(rs...))
	if x := tl.snapshot(0, 0)[0]; !x.Ended.Equal(at(20)) || !strings.Contains(x.Err, "unseen") {
		t.Fatalf("partition 0 gone from the status: %+v", x)
	}
}

// TestTimelineShortAttempt: an attempt that starts and ends between two
// passes is recorded from its final status, once.
func TestTimelineShortAttempt(t *testing.T) {
	tl := newTimelines(10, 4)
	r := &ReplicaStatus{Partition: 0}
	tl.sample(at(0), statuses(r))
	r.Rejoin = &RejoinStatus{Role: "destination", Peer: "n1", Epoch: 1, Phase: "live", Rows: 5, Started: at(0).Add(time.Millisecond)}
	tl.sample(at(1), statuses(r))
	tl.sample(at(2), statuses(r))
	got := tl.snapshot(-1, 0)
	if len(got) != 1 || len(got[0].Samples) != 1 || got[0].Samples[0].Rows != 5 || !got[0].Ended.Equal(at(1)) {
		t.Fatalf("got %+v, want one timeline of one sample ended at the pass", got)
	}
}

// TestTimelineJSONRoundTrip: what GET /timeline encodes decodes back
// equal.
func TestTimelineJSONRoundTrip(t *testing.T) {
	tl := newTimelines(4, 4)
	r := &ReplicaStatus{Partition: 2, TxnsExecuted: 1}
	for i, ph := range []string{"streaming", "streaming", "catching-up", "handing-off", "handing-off", "live"} {
		r.Rejoin = &RejoinStatus{Role: "destination", Peer: "n3", Epoch: 11, Phase: ph, Rows: int64(i * 1000), Bytes: int64(i * 99000),
			SnapshotRows: int64(i * 900), ThrottledMs: float64(i) * 2.5, PeerHoldMs: float64(i % 2), Started: t0}
		r.Sources = []RejoinStatus{{Role: "source", Peer: "n4", Epoch: 12, Phase: "streaming", LogBytesPeak: i * 4096, Started: t0}}
		r.TxnsExecuted += uint64(i * 7)
		tl.sample(at(i), statuses(r))
	}
	want := Timelines{Node: "n1", EveryMs: 100, Rejoins: tl.snapshot(-1, 0)}
	b, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got Timelines
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip differs:\n got %+v\nwant %+v", got, want)
	}
	if got.Rejoins[0].Dropped != 2 || len(got.Rejoins[0].Samples) != 4 || got.Rejoins[0].Ended.IsZero() {
		t.Fatalf("destination timeline %+v", got.Rejoins[0])
	}
}

// TestTimelineRunStops: the recorder's goroutine samples on its ticker
// and ends with its context (goleak checks the rest).
func TestTimelineRunStops(t *testing.T) {
	tl := newTimelines(10, 2)
	r := &ReplicaStatus{Partition: 0, Rejoin: &RejoinStatus{Role: "destination", Peer: "n1", Epoch: 1, Phase: "streaming", Started: time.Now()}}
	passes := make(chan struct{}, 3)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tl.run(ctx, time.Millisecond, func(yield func(*ReplicaStatus)) {
			yield(r)
			select {
			case passes <- struct{}{}:
			default:
			}
		})
	}()
	for range 3 {
		select {
		case <-passes:
		case <-time.After(10 * time.Second):
			t.Fatal("the recorder did not sample")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the recorder did not stop")
	}
	if got := tl.snapshot(-1, 0); len(got) != 1 || len(got[0].Samples) < 3 {
		t.Fatalf("got %+v, want one timeline of 3 samples or more", got)
	}
}

// TestTimelineHTTP: a node records both sides of a real rejoin, its
// stream slowed to last several passes, and serves them on GET /timeline;
// what it serves decodes and re-encodes to the same bytes, and ends where
// the status ends.
func TestTimelineHTTP(t *testing.T) {
	c := newClusterStarting(t, 2, 0, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	// ~870 KB of rows at 1 MiB/s: most of a second of stream.
	slow := func(cfg *Config) { cfg.RateBytesPerSec = 1 << 20 }
	c.startCfg(1, slow)
	c.startCfg(2, slow)
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	// Random values: the stream's codec would squeeze zeros to nothing.
	rng := rand.NewChaCha8([32]byte{1})
	vals := make([]wire.Value, 0, 2+2*400)
	for b := range 10 {
		vals = append(vals[:0], wire.String("kv"), wire.Int64(400))
		for i := range 400 {
			v := make([]byte, 200)
			_, _ = rng.Read(v)
			vals = append(vals, wire.Bytes(fmt.Appendf(nil, "key-%08d", b*400+i)), wire.Bytes(v))
		}
		if _, err := cl.call(0, partition.ProcUpsertMany, false, vals...); err != nil {
			t.Fatal(err)
		}
	}
	c.stop(2)
	a2 := c.startCfg(2, slow)
	var src RejoinStatus
	waitUntil(t, 30*time.Second, "the rejoin done on both sides", func() bool {
		srcs := nodeStatus(t, c.nodes[1].addrs).Replicas[0].Sources
		if len(srcs) == 1 {
			src = srcs[0]
		}
		return nodeStatus(t, a2).Replicas[0].State == recovery.ReplicaLive && src.Phase == "done"
	})
	dst := *nodeStatus(t, a2).Replicas[0].Rejoin
	time.Sleep(3 * TimelineEvery) // the recorder sees the ends

	check := func(addrs Addrs, role, peer, lastPhase string, st RejoinStatus) {
		t.Helper()
		body := getBody(t, "http://"+addrs.HTTP+"/timeline", http.StatusOK)
		var tls Timelines
		if err := json.Unmarshal(body, &tls); err != nil {
			t.Fatal(err)
		}
		again, err := json.Marshal(tls)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(append(again, '\n'), body) {
			t.Errorf("%s: decoded and encoded again differs:\n%s\n%s", addrs.Node, again, body)
		}
		if tls.Node != addrs.Node || tls.EveryMs != 100 || len(tls.Rejoins) != 1 {
			t.Fatalf("%s: %s", addrs.Node, body)
		}
		tl := tls.Rejoins[0]
		if tl.Partition != 0 || tl.Role != role || tl.Peer != peer || tl.Epoch != st.Epoch || tl.Ended.IsZero() || tl.Err != "" {
			t.Errorf("%s: timeline %+v, status %+v", addrs.Node, tl, st)
		}
		under, mid := 0, 0
		for i, s := range tl.Samples {
			if i > 0 && (!s.At.After(tl.Samples[i-1].At) || s.Rows < tl.Samples[i-1].Rows) {
				t.Errorf("%s: sample %d %+v after %+v", addrs.Node, i, s, tl.Samples[i-1])
			}
			if !finalPhase(s.Phase) {
				under++
			}
			if s.Phase == "streaming" && s.Rows < st.Rows {
				mid++
			}
		}
		last := tl.Samples[len(tl.Samples)-1]
		if last.Phase != lastPhase || last.Rows != st.Rows || last.Bytes != st.Bytes {
			t.Errorf("%s: last sample %+v, status %+v", addrs.Node, last, st)
		}
		// The source counts rows as it queues them, ahead of the rate
		// limit; the destination as it applies them.
		if under < 3 || (role == "destination" && mid < 3) {
			t.Errorf("%s: %d samples under way, %d mid-stream; want 3 or more: %+v", addrs.Node, under, mid, tl.Samples)
		}
	}
	check(a2, "destination", "n1", "live", dst)
	check(c.nodes[1].addrs, "source", "n2", "done", src)

	if b := getBody(t, "http://"+a2.HTTP+"/timeline?partition=1", http.StatusOK); !bytes.Contains(b, []byte(`"rejoins":[]`)) {
		t.Errorf("?partition=1: %s", b)
	}
	getBody(t, "http://"+a2.HTTP+"/timeline?last=0", http.StatusBadRequest)
	getBody(t, "http://"+a2.HTTP+"/timeline?partition=x", http.StatusBadRequest)
}

func getBody(t *testing.T, url string, want int) []byte {
	t.Helper()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	return b
}
