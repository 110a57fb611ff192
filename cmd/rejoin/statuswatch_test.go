package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/client/clienttest"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// TestStatusWatch: `rejoin status --watch --count 3` against two nodes'
// /status (canned: n2's replica of partition 3 rejoins from n1, 1 MB more
// at every answer) draws three redraws, each with the attempt's line:
// partition, source→destination, phase, rows, MB/s, the source's
// change-log peak and throttle; then n1 stops answering and the redraw
// says so.
func TestStatusWatch(t *testing.T) {
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := clienttest.WriteCluster(ctx, cli, 4, clienttest.KVSchema()); err != nil {
		t.Fatal(err)
	}
	started := time.Now().Add(-10 * time.Second)
	var answers atomic.Int64
	serve := func(st func() node.Status) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewEncoder(w).Encode(st())
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	n1 := serve(func() node.Status {
		return node.Status{Node: "n1", Replicas: []node.ReplicaStatus{{Partition: 3, State: recovery.ReplicaLive,
			Sources: []node.RejoinStatus{{Role: "source", Peer: "n2", Epoch: 7, Phase: "streaming", LogBytesPeak: 2_500_000, ThrottledMs: 40, Started: started}}}}}
	})
	n2 := serve(func() node.Status {
		i := answers.Add(1)
		return node.Status{Node: "n2", Replicas: []node.ReplicaStatus{
			{Partition: 3, State: recovery.ReplicaRejoining, Rejoin: &node.RejoinStatus{Role: "destination", Peer: "n1", Epoch: 7, Phase: "streaming", Rows: 1000 * i, Bytes: 1_000_000 * i, Started: started}},
			{Partition: 1, State: recovery.ReplicaLive, Rejoin: &node.RejoinStatus{Role: "destination", Peer: "n1", Epoch: 2, Phase: "live", Started: started, Ended: started.Add(time.Second)}},
			// Live, its attempt not ended yet as the node reports it: done,
			// not under way.
			{Partition: 2, State: recovery.ReplicaLive, Rejoin: &node.RejoinStatus{Role: "destination", Peer: "n1", Epoch: 3, Phase: "live", Started: started}},
		}}
	})
	for id, srv := range map[string]*httptest.Server{"n1": n1, "n2": n2} {
		b, err := json.Marshal(supervise.NodeRecord{Address: "127.0.0.1:1", HTTP: srv.URL, Started: time.Now().UTC(), LastActive: time.Now().UTC(), Status: supervise.NodeReady})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, supervise.NodeKey(id), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	ep := strings.Join(e.Endpoints(), ",")
	r := runArgs("status", "--etcd", ep, "--watch", "--count", "3", "--every", "100ms")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	t.Logf("stdout:\n%s", r.stdout)
	if got := strings.Count(r.stdout, " 1 rejoining\n"); got != 3 {
		t.Errorf("%d redraws with one rejoin, want 3", got)
	}
	lines := strings.Split(r.stdout, "\n")
	var rows []string
	for _, l := range lines {
		if strings.HasPrefix(l, "3 ") {
			rows = append(rows, strings.Join(strings.Fields(l), " "))
		}
	}
	if len(rows) != 3 || !strings.HasPrefix(rows[0], "3 n1→n2 streaming 1000 0.1 2.5 MB 40 ms") || !strings.HasPrefix(rows[2], "3 n1→n2 streaming 3000 ") {
		t.Fatalf("rows %q", rows)
	}
	// The second redraw's rate is its 1 MB over the ~100 ms since the first.
	if f := strings.Fields(rows[1]); len(f) < 5 || f[4] == "0.1" || f[4] == "0.0" {
		t.Errorf("second redraw's MB/s %q: want the rate since the first", rows[1])
	}
	n1.Close()
	r = runArgs("status", "--etcd", ep, "--watch", "--count", "1", "--node-timeout", "500ms")
	if r.code != 0 || !strings.Contains(r.stdout, "(no /status from [n1])") || !strings.Contains(r.stdout, "3  ") {
		t.Fatalf("with n1 down: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	for _, bad := range [][]string{{"--count", "2"}, {"--watch", "--every", "0s"}, {"--watch", "--count", "-1"}} {
		if r := runArgs(append([]string{"status", "--etcd", ep}, bad...)...); r.code != 2 {
			t.Errorf("status %q: exit %d, want 2 (stderr %q)", bad, r.code, r.stderr)
		}
	}
}
