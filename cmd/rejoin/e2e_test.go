package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
)

// The end-to-end tests run the demo's path (demo.Run, as `rejoin demo
// --json` does) against node processes of this command, built once.

var (
	buildOnce sync.Once
	buildDir  string
	binPath   string
	buildErr  error
)

// rejoinBinary builds cmd/rejoin once per test run.
func rejoinBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "rejoin-e2e-bin-")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(buildDir, "rejoin")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// e2eConfig is the small demo of the tests. The partitions are larger
// than a rejoin stream's window of unacknowledged blocks (16 x 256 KiB),
// so that a hold at half the rows stops the source mid-snapshot.
func e2eConfig(t *testing.T, fault demo.Fault) demo.Config {
	cfg := demo.Config{
		Binary:     rejoinBinary(t),
		Nodes:      3,
		Partitions: 2,
		Replicas:   2,
		Rows:       120_000,
		ValueBytes: 100,
		Fault:      fault,
		JSON:       true,
		Before:     time.Second,
		Timeout:    100 * time.Second,
		Stderr:     &testWriter{t: t},
	}
	if fault == demo.FaultKillSource {
		cfg.Replicas = 3
	}
	return cfg
}

// testWriter sends the demo's event lines to t.Log.
type testWriter struct {
	t  *testing.T
	mu sync.Mutex
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestDemoEndToEnd(t *testing.T) {
	type demoCase struct {
		fault    demo.Fault
		writeAll bool
	}
	var cases []demoCase
	for _, fault := range demo.Faults {
		cases = append(cases, demoCase{fault: fault})
	}
	// Writes through every node: the killed nodes' initiators die with
	// txns in flight, and the survivors must repair what they tore.
	cases = append(cases, demoCase{fault: demo.FaultKillSource, writeAll: true})
	for _, tc := range cases {
		fault := tc.fault
		name := string(fault)
		if tc.writeAll {
			name += "/write-all"
		}
		t.Run(name, func(t *testing.T) {
			cfg := e2eConfig(t, fault)
			cfg.WriteAll = tc.writeAll
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var out bytes.Buffer
			sum, err := demo.Run(ctx, cfg, &out)
			if err != nil {
				t.Fatalf("demo: %v\nsummary: %+v", err, sum)
			}
			var printed map[string]any
			if err := json.Unmarshal(out.Bytes(), &printed); err != nil {
				t.Fatalf("--json output %q: %v", out.String(), err)
			}
			// Secure by default (issue 13): every connection was mutual TLS.
			if printed["tls"] != true || !sum.TLS {
				t.Errorf("printed tls %v, summary TLS %v; want a secure run", printed["tls"], sum.TLS)
			}
			// etcd too: TLS, client certificates required of the nodes.
			if printed["etcd_tls"] != true || !sum.EtcdTLS || !strings.HasPrefix(sum.Etcd, "https://") {
				t.Errorf("printed etcd_tls %v, summary EtcdTLS %v, etcd %s; want etcd over TLS", printed["etcd_tls"], sum.EtcdTLS, sum.Etcd)
			}
			if printed["digests_match"] != true || printed["acked_writes_lost"] != 0.0 {
				t.Errorf("printed summary: digests_match %v, acked_writes_lost %v", printed["digests_match"], printed["acked_writes_lost"])
			}
			if !sum.DigestsMatch || sum.AckedWritesLost != 0 {
				t.Errorf("digests match %v, acked writes lost %d", sum.DigestsMatch, sum.AckedWritesLost)
			}
			if want := int(cfg.Partitions) * cfg.Replicas; sum.ReplicasChecked != want {
				t.Errorf("%d replicas checked, want %d", sum.ReplicasChecked, want)
			}
			if sum.AckedWritesChecked == 0 || sum.Rows == 0 || sum.RejoinSeconds <= 0 || sum.WritesPerSecBefore <= 0 {
				t.Errorf("figures not measured: %+v", sum)
			}
			if fault != demo.FaultNone && sum.FaultTarget == "" {
				t.Errorf("fault %s hit nothing", fault)
			}
			if fault == demo.FaultKillSource && strings.HasPrefix(sum.FaultTarget, demo.Gateway) {
				t.Errorf("kill-source killed the gateway")
			}
			// The fault must have hit the rejoin, not passed beside it:
			// a cut link resumes the same attempt with blocks sent
			// again; every other fault ends an attempt, so some task
			// needs a second one.
			switch fault {
			case demo.FaultCutLink:
				if sum.BlocksResent < 1 || sum.Attempts != sum.RejoinedTasks {
					t.Errorf("cut-link: %d blocks resent, %d attempts for %d tasks; want a resume, no new attempt", sum.BlocksResent, sum.Attempts, sum.RejoinedTasks)
				}
			case demo.FaultKillSource, demo.FaultKillDestination, demo.FaultPauseHolder, demo.FaultPauseEtcd:
				if sum.Attempts <= sum.RejoinedTasks {
					t.Errorf("%s: %d attempts for %d tasks; the fault ended none", fault, sum.Attempts, sum.RejoinedTasks)
				}
			}
			if _, err := os.Stat(sum.Dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("work dir %s left behind: %v", sum.Dir, err)
			}
			checkNoNodes(t)
			t.Logf("summary: %s", strings.TrimSpace(out.String()))
		})
	}
}

// TestDemoInterrupted ends the demo's context mid-run (Ctrl-C) and checks
// that it returns soon with every node stopped and its directory gone.
func TestDemoInterrupted(t *testing.T) {
	cfg := e2eConfig(t, demo.FaultNone)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(4*time.Second, cancel)
	start := time.Now()
	sum, err := demo.Run(ctx, cfg, &bytes.Buffer{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("demo ended with %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 4*time.Second+10*time.Second {
		t.Errorf("demo took %s to stop after the interrupt", d-4*time.Second)
	}
	if _, err := os.Stat(sum.Dir); sum.Dir != "" && !errors.Is(err, os.ErrNotExist) {
		t.Errorf("work dir %s left behind: %v", sum.Dir, err)
	}
	checkNoNodes(t)
}

// checkNoNodes fails if a node or etcd process of the test-built binary
// still runs.
func checkNoNodes(t *testing.T) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && (bytes.HasPrefix(b, []byte(binPath+"\x00node")) || bytes.HasPrefix(b, []byte(binPath+"\x00etcd"))) {
			t.Errorf("process left running: %s %q", p, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
}
