package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/chaos"
)

// chaosConfig is the small chaos run of the tests: three nodes, every
// partition on all of them, a few rows, no network faults (whether they
// can run depends on the machine; TestChaosNetFaults has them).
func chaosConfig(t *testing.T) chaos.Config {
	return chaos.Config{
		Binary:     rejoinBinary(t),
		Dir:        t.TempDir(),
		NetFaults:  "off",
		Nodes:      3,
		Partitions: 4,
		Replicas:   3,
		Rows:       5000,
		JSON:       true,
		Stderr:     &testWriter{t: t},
	}
}

// TestChaosPlantedFault: with the planted fault (each node loses its first
// acknowledged write of register 0), chaos must say FAIL, name the
// register, give its history and keep porcupine's visualisation; the
// other checks must pass (the fault loses a register write only).
func TestChaosPlantedFault(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := chaosConfig(t)
	cfg.Duration, cfg.Seed, cfg.Plant = 12*time.Second, 1, true
	var out bytes.Buffer
	sum, err := chaos.Run(context.Background(), cfg, &out)
	if !errors.Is(err, chaos.ErrFail) {
		t.Fatalf("Run = %v, want ErrFail; summary:\n%s", err, out.String())
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got["verdict"] != "FAIL" {
		t.Fatalf("--json output: verdict %v (%v), want FAIL:\n%s", got["verdict"], err, out.String())
	}
	k := sum.FailingKey
	switch {
	case k == nil:
		t.Fatalf("no failing key; reasons %q", sum.Reasons)
	case k.Key != chaos.RegisterKey(0) || k.Result != "Illegal":
		t.Fatalf("failing key %s (%s), want %s (Illegal)", k.Key, k.Result, chaos.RegisterKey(0))
	case len(k.History) != k.Ops || k.Ops == 0 || k.Suspect < 0:
		t.Fatalf("failing key's history: %d lines for %d ops, suspect %d", len(k.History), k.Ops, k.Suspect)
	}
	if fi, err := os.Stat(k.Visualization); err != nil || fi.Size() == 0 {
		t.Fatalf("visualisation %s: %v", k.Visualization, err)
	}
	if len(sum.Reasons) != 1 || !strings.Contains(sum.Reasons[0], chaos.RegisterKey(0)+" is not linearizable") {
		t.Fatalf("reasons %q, want the register's only", sum.Reasons)
	}
	if !sum.AllLive || !sum.DigestsMatch || sum.AckedWritesLost != 0 || len(sum.SelfExits) != 0 {
		t.Fatalf("the other checks failed: %+v", sum)
	}
	t.Logf("suspect read: %s", k.History[k.Suspect])
}

// TestChaosPass: a short run with node faults and no planted fault passes
// every check.
func TestChaosPass(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg := chaosConfig(t)
	cfg.Duration, cfg.Seed = 25*time.Second, 11
	cfg.Faults = []chaos.Action{chaos.ActKill, chaos.ActStop, chaos.ActKillSource, chaos.ActKillDestination}
	var out bytes.Buffer
	sum, err := chaos.Run(context.Background(), cfg, &out)
	if err != nil || sum.Verdict != "PASS" {
		t.Fatalf("Run = %v, verdict %s, want PASS:\n%s", err, sum.Verdict, out.String())
	}
	if sum.FaultsDone == 0 || sum.RegisterOK == 0 || sum.Writes == 0 || sum.Linearizable != 8 || sum.ReplicasChecked != 12 {
		t.Fatalf("a run that did too little: %+v", sum)
	}
	if want := chaos.Plan(11, cfg.Duration, 3, 4*time.Second, cfg.Faults); len(sum.Schedule) != len(want) || !slices.Equal(sum.Schedule[:1], []string{want[0].String()}) {
		t.Fatalf("schedule %q, want Plan's %v", sum.Schedule, want)
	}
}

// TestChaosNetFaults: as root with iptables, network faults run between
// the node processes (each its own uid), the availability figures come
// out, and the run's chain is gone afterwards. The verdict is not
// checked: a reset may still lose replicas (issue 23).
func TestChaosNetFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a chaos run of some 30 s")
	}
	if os.Geteuid() != 0 {
		t.Skip("network faults need root")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("network faults need iptables")
	}
	defer goleak.VerifyNone(t)
	cfg := chaosConfig(t)
	// The nodes' uids must reach the run directory: t.TempDir's parent
	// is private.
	dir, err := os.MkdirTemp("", "rejoin-chaos-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.Dir, cfg.NetFaults = dir, "on"
	cfg.Duration, cfg.Seed, cfg.LiveWithin = 15*time.Second, 5, 30*time.Second
	cfg.Faults = []chaos.Action{chaos.ActNetPeers, chaos.ActNetEtcd, chaos.ActNetIsolate}
	var out bytes.Buffer
	sum, err := chaos.Run(context.Background(), cfg, &out)
	if err != nil && !errors.Is(err, chaos.ErrFail) {
		t.Fatalf("Run = %v:\n%s", err, out.String())
	}
	t.Logf("verdict %s %q", sum.Verdict, sum.Reasons)
	if sum.NetFaults != "on" || sum.FaultsDone == 0 || sum.Availability == nil || sum.Availability.Windows == 0 {
		t.Fatalf("no network fault ran: %+v", sum)
	}
	t.Logf("availability: %.2f s with a faulted replica, %.2f s without", sum.Availability.MaxGapFaulted, sum.Availability.MaxGapUnfaulted)
	rules, err := exec.Command("iptables", "-w", "5", "-S").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables -S: %v: %s", err, rules)
	}
	if ch := chaos.ChainName(os.Getpid()); strings.Contains(string(rules), ch) {
		t.Fatalf("the run's chain %s is left:\n%s", ch, rules)
	}
}
