package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
)

// needRedisServer skips the test outside CI when redis-server is not
// installed, and fails it in CI (CI set), where .ci/run installs it: the
// Redis bench must run there.
func needRedisServer(t *testing.T) {
	t.Helper()
	if _, err := demo.FindRedisServer(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: %v", err)
		}
		t.Skipf("%v; outside CI this test needs it installed", err)
	}
}

// TestBenchRedis runs `rejoin bench --redis --json` at a small size: a
// fresh replica's full resync of 20,000 keys under 500 writes/s offered
// ends in sync with the master's content, the JSON decodes into
// demo.BenchSummary with the figures in place, and every redis-server
// started and its temporary directory are gone.
func TestBenchRedis(t *testing.T) {
	needRedisServer(t)
	defer goleak.VerifyNone(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var out, errOut bytes.Buffer
	if code := run([]string{"bench", "--redis", "--rows", "20000", "--write-rate", "500", "--writers", "16",
		"--before", "1s", "--timeout", "2m", "--json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	if left := childRedisServers(t); len(left) > 0 {
		t.Errorf("redis-server processes left running: pids %v", left)
	}
	if ents, err := os.ReadDir(tmp); err != nil || len(ents) > 0 {
		t.Errorf("temporary directory not removed: %v %v", ents, err)
	}

	var printed map[string]any
	if err := json.Unmarshal(out.Bytes(), &printed); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	for _, k := range []string{"rejoin_seconds", "stream_seconds", "rows_per_sec", "mb_per_sec", "offered_writes_per_sec",
		"served_ratio_before", "served_ratio_during", "writes_per_sec_before", "writes_per_sec_during",
		"write_p99_ms_before", "write_p99_ms_during", "writes_missed_during", "digests_match", "redis"} {
		if _, ok := printed[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	var got demo.BenchSummary
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	r := got.Redis
	if r == nil {
		t.Fatalf("no redis object in %s", out.String())
	}
	if r.Version == "" || !strings.Contains(strings.Join(r.Settings, " "), `repl-diskless-load "on-empty-db"`) {
		t.Errorf("servers: version %q, settings %q", r.Version, r.Settings)
	}
	// The replica holds every loaded key and the writer's new ones, and
	// its content equals the master's at a quiet point.
	if !got.DigestsMatch || got.ReplicasChecked != 2 || r.MasterKeys < 20000 || r.ReplicaKeys != r.MasterKeys ||
		len(r.MasterDigest) != 40 || r.ReplicaDigest != r.MasterDigest || r.Offset <= 0 {
		t.Errorf("content: match %v over %d, master %d keys %q, replica %d keys %q, offset %d",
			got.DigestsMatch, got.ReplicasChecked, r.MasterKeys, r.MasterDigest, r.ReplicaKeys, r.ReplicaDigest, r.Offset)
	}
	if got.LoadRows != 20000 || got.Rows < 20000 || got.Rows > r.MasterKeys || got.Bytes != got.Rows*116 || r.ReplBytes <= 0 {
		t.Errorf("rows: loaded %d, resynced %d (%d B), master %d at the end, %d B sent", got.LoadRows, got.Rows, got.Bytes, r.MasterKeys, r.ReplBytes)
	}
	if got.StreamSeconds <= 0 || got.RejoinSeconds < got.StreamSeconds || got.RowsPerSec <= 0 || got.MBPerSec <= 0 {
		t.Errorf("resync: %v s to the link up, %v s to in sync, %v rows/s, %v MB/s", got.StreamSeconds, got.RejoinSeconds, got.RowsPerSec, got.MBPerSec)
	}
	if got.OfferedWritesPerSec != 500 || got.WritesPerSecBefore <= 0 || got.WriteP99MsBefore <= 0 || got.WriteErrors != 0 {
		t.Errorf("writer: offered %v, before %v/s p99 %v ms, %d errors", got.OfferedWritesPerSec, got.WritesPerSecBefore, got.WriteP99MsBefore, got.WriteErrors)
	}
	if got.ServedRatioBefore != got.WritesPerSecBefore/500 || got.ServedRatioDuring != got.WritesPerSecDuring/500 {
		t.Errorf("ratios %v and %v for %v/s and %v/s of 500", got.ServedRatioBefore, got.ServedRatioDuring, got.WritesPerSecBefore, got.WritesPerSecDuring)
	}

	var text bytes.Buffer
	if err := demo.WriteBenchText(&text, got); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== rejoin bench --redis: OK ==", "served during the resync", "content     equal at offset " + strconv.FormatInt(r.Offset, 10)} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text summary lacks %q:\n%s", want, text.String())
		}
	}
}

// childRedisServers lists the pids of redis-server processes whose parent
// is this test process.
func childRedisServers(t *testing.T) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 2 || s[open+1:end] != "redis-server" || f[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(s[:open]))
		pids = append(pids, pid)
	}
	return pids
}

// TestBenchRedisFlags: the Redis mode refuses the other modes' flags, a
// second mode, and a missing redis-server, with a message naming the
// install.
func TestBenchRedisFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--redis", "--processes"}, "--processes and --redis: pick one"},
		{[]string{"bench", "--redis", "--codec", "s2"}, "--codec is a flag of the in-process bench only"},
		{[]string{"bench", "--redis", "--insecure"}, "--insecure is a flag of --processes only"},
		{[]string{"bench", "--processes", "--redis-server", "x"}, "--redis-server is a flag of --redis only"},
		{[]string{"bench", "--writers", "3"}, "--writers is a flag of --processes and --redis only"},
		{[]string{"bench", "--redis", "--write-rate", "0"}, "the bench offers a fixed rate"},
		{[]string{"bench", "--redis", "--rows", "0"}, "--rows 0: want 1 or more"},
		{[]string{"bench", "--redis", "--redis-server", filepath.Join(t.TempDir(), "none")}, "no such file"},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}

	t.Setenv("PATH", t.TempDir())
	if _, err := exec.LookPath("redis-server"); !errors.Is(err, exec.ErrNotFound) {
		t.Fatalf("redis-server still found: %v", err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"bench", "--redis"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "apt-get install redis-server") {
		t.Errorf("no redis-server: exit %d, stderr %q", code, errOut.String())
	}

	errOut.Reset()
	if code := run([]string{"bench", "-h"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "rejoin bench --redis") ||
		!strings.Contains(errOut.String(), "repl-diskless-load") {
		t.Errorf("bench -h: exit %d, %q", code, errOut.String())
	}
}
