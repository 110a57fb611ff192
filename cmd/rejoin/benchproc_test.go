package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
)

// TestBenchProcesses runs `rejoin bench --processes --json --plot` as a
// process of the test-built binary, at a small size: n2 rejoins every row
// of the cluster from n1 under a fixed offered rate, the JSON decodes into
// demo.BenchSummary and encodes back to the same object, and the plot is
// drawn.
func TestBenchProcesses(t *testing.T) {
	bin := rejoinBinary(t)
	dir := t.TempDir()
	plot := filepath.Join(dir, "bench.png")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "--processes", "--rows", "4000", "--partitions", "2",
		"--write-rate", "500", "--before", "1s", "--json", "--plot", plot)
	// At the bound, SIGTERM: the bench stops its node processes and etcd
	// on its way out.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("rejoin bench --processes: %v\nstderr:\n%s", err, errOut.String())
	}
	checkNoNodes(t)

	var got demo.BenchSummary
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	// Round trip: what decodes encodes back to the same object, so no
	// field is lost or misnamed between the two.
	again, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var printed, reencoded map[string]any
	if err := json.Unmarshal(out.Bytes(), &printed); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(again, &reencoded); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(printed, reencoded) {
		t.Errorf("JSON does not round-trip:\nprinted   %v\nreencoded %v", printed, reencoded)
	}
	for _, k := range []string{"rejoin_seconds", "rows_per_sec", "mb_per_sec", "offered_writes_per_sec", "served_ratio_before",
		"served_ratio_during", "writes_per_sec_during", "write_p99_ms_before", "write_p99_ms_during", "handoff_pause_ms_max",
		"digests", "digests_match", "acked_writes_lost", "writes_missed_during"} {
		if _, ok := printed[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}

	if got.Nodes != demo.BenchNodes || got.Replicas != demo.BenchReplicas || got.Partitions != 2 || got.Victim != "n2" || !got.TLS {
		t.Errorf("shape: %d nodes, %d x %d, victim %s, tls %v", got.Nodes, got.Partitions, got.Replicas, got.Victim, got.TLS)
	}
	// n2 held every partition, so it rejoined every row: the loaded ones
	// and the writer's new ones.
	if got.RejoinedTasks != 2 || got.Rows < 4000 || got.SnapshotRows < 4000 {
		t.Errorf("n2 rejoined %d partitions, %d rows (%d snapshot); want 2 and every row", got.RejoinedTasks, got.Rows, got.SnapshotRows)
	}
	if !got.DigestsMatch || got.AckedWritesLost != 0 || got.ReplicasChecked != 4 || got.AckedWritesChecked == 0 {
		t.Errorf("checks: digests match %v over %d replicas, %d acked read back, %d lost",
			got.DigestsMatch, got.ReplicasChecked, got.AckedWritesChecked, got.AckedWritesLost)
	}
	if got.OfferedWritesPerSec != 500 || got.RejoinSeconds <= 0 || got.WritesPerSecBefore <= 0 {
		t.Errorf("figures: offered %v, rejoin %v s, before %v/s", got.OfferedWritesPerSec, got.RejoinSeconds, got.WritesPerSecBefore)
	}
	// The ratios are the served rates over the offered one, as printed.
	if got.ServedRatioBefore != got.WritesPerSecBefore/500 || got.ServedRatioDuring != got.WritesPerSecDuring/500 {
		t.Errorf("ratios %v and %v for %v/s and %v/s of 500", got.ServedRatioBefore, got.ServedRatioDuring, got.WritesPerSecBefore, got.WritesPerSecDuring)
	}

	_, d := readPlot(t, plot)
	if !strings.HasPrefix(d.Title, "rejoin bench:") || len(d.Rejoin) == 0 || len(d.Writer) == 0 {
		t.Errorf("plot data: title %q, %d rejoin samples, %d writer points", d.Title, len(d.Rejoin), len(d.Writer))
	}
}

// TestBenchProcessesFlags: a flag of one mode given in the other is an
// error, and so is a shape the bench does not run.
func TestBenchProcessesFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--processes", "--codec", "s2"}, "--codec is a flag of the in-process bench"},
		{[]string{"bench", "--processes", "--writer"}, "--writer is a flag of the in-process bench"},
		{[]string{"bench", "--plot", "x.png"}, "--plot is a flag of --processes only"},
		{[]string{"bench", "--insecure"}, "--insecure is a flag of --processes only"},
		{[]string{"bench", "--processes", "--partitions", "0"}, "--partitions 0"},
		{[]string{"bench", "--processes", "--write-rate", "0"}, "the bench offers a fixed rate"},
		{[]string{"bench", "--processes", "--plot", "x.jpg"}, "ending in .png"},
		{[]string{"bench", "--processes", "extra"}, `unexpected argument "extra"`},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"bench", "-h"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "rejoin bench --processes") ||
		!strings.Contains(errOut.String(), "served/offered") {
		t.Errorf("bench -h: exit %d, %q", code, errOut.String())
	}
}
