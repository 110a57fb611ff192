package main

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

func TestNodeFlags(t *testing.T) {
	fs := newFlagSet("node", &bytes.Buffer{})
	f := newNodeFlags(fs)
	certsDir := t.TempDir()
	if _, err := certs.CreateCA(certsDir, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := certs.Create(certsDir, certs.NodeID(7), certs.IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	err := fs.Parse([]string{"--id", "7", "--certs-dir", certsDir, "--listen", "127.0.0.1:7000", "--http", "127.0.0.1:7001",
		"--etcd", "http://a:2379, http://b:2379,", "--data", "/d", "--node-ttl", "3s", "--claim-ttl", "4s",
		"--incoming-max", "5", "--outgoing-max", "6", "--rate-bytes", "1000", "--call-wait", "3s", "--log-format", "json"})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cfg, err := f.config(&logs)
	if err != nil {
		t.Fatal(err)
	}
	want := node.Config{ID: 7, Listen: "127.0.0.1:7000", HTTP: "127.0.0.1:7001", Etcd: []string{"http://a:2379", "http://b:2379"},
		DataDir: "/d", NodeTTL: 3 * time.Second, ClaimTTL: 4 * time.Second, IncomingMax: 5, OutgoingMax: 6, RateBytesPerSec: 1000, CallWait: 3 * time.Second}
	got := cfg
	got.Log = nil
	if got.ID != want.ID || got.Listen != want.Listen || got.HTTP != want.HTTP || strings.Join(got.Etcd, " ") != strings.Join(want.Etcd, " ") ||
		got.DataDir != want.DataDir || got.NodeTTL != want.NodeTTL || got.ClaimTTL != want.ClaimTTL ||
		got.IncomingMax != want.IncomingMax || got.OutgoingMax != want.OutgoingMax || got.RateBytesPerSec != want.RateBytesPerSec ||
		got.CallWait != want.CallWait {
		t.Fatalf("config %+v, want %+v", got, want)
	}
	if got.TLS == nil || got.TLS.Identity() != certs.NodeID(7) || got.Insecure {
		t.Fatalf("config TLS %v insecure %v, want n7's credentials", got.TLS, got.Insecure)
	}
	cfg.Log.Info("hello")
	if !strings.HasPrefix(logs.String(), `{"time":`) {
		t.Fatalf("--log-format json logged %q", logs.String())
	}
}

// TestNodeBoundFlags: the node's bounds that deserve a flag reach its
// config.
func TestNodeBoundFlags(t *testing.T) {
	fs := newFlagSet("node", &bytes.Buffer{})
	f := newNodeFlags(fs)
	if err := fs.Parse([]string{"--id", "1", "--insecure", "--etcd", "http://a:2379", "--data", "/d", "--conns-max", "9", "--rejoin-buffer-bytes", "1048576",
		"--apply-max", "3", "--beat-lead", "-1ms", "--pace-target", "5ms"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.config(&bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ConnsMax != 9 || cfg.RejoinBufferBytesMax != 1<<20 {
		t.Fatalf("ConnsMax %d, RejoinBufferBytesMax %d; want 9 and %d", cfg.ConnsMax, cfg.RejoinBufferBytesMax, 1<<20)
	}
	if cfg.ApplyMax != 3 || cfg.BeatLead != -time.Millisecond || cfg.PaceTarget != 5*time.Millisecond {
		t.Fatalf("ApplyMax %d, BeatLead %s, PaceTarget %s; want 3, -1ms and 5ms", cfg.ApplyMax, cfg.BeatLead, cfg.PaceTarget)
	}
}

// TestNodeUnreachableEtcdFailsWithinBound (issue 9 point 7): with an
// --etcd that takes connections and never answers (as a paused etcd
// does, so the probe has no verdict), `rejoin node` fails within its
// --etcd-timeout (plus the machine's slack), naming the step and the
// bound, instead of hanging; the bound defaults to node.EtcdTimeoutDefault.
func TestNodeUnreachableEtcdFailsWithinBound(t *testing.T) {
	fs := newFlagSet("node", &bytes.Buffer{})
	if f := newNodeFlags(fs); f.cfg.EtcdTimeout != node.EtcdTimeoutDefault || node.EtcdTimeoutDefault != 10*time.Second {
		t.Fatalf("--etcd-timeout defaults to %s", f.cfg.EtcdTimeout)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	const bound = 2 * time.Second
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := run([]string{"node", "--id", "1", "--etcd", "http://" + ln.Addr().String(), "--data", t.TempDir(), "--insecure", "--etcd-timeout", bound.String()}, &stdout, &stderr)
	took := time.Since(start)
	t.Logf("exit %d after %s: %s", code, took, strings.TrimSpace(stderr.String()))
	if code != 1 {
		t.Fatalf("exit code %d, want 1; stderr %q", code, stderr.String())
	}
	if took > bound+5*time.Second {
		t.Fatalf("took %s, bound %s", took, bound)
	}
	if msg := stderr.String(); !strings.Contains(msg, "read the cluster layout") || !strings.Contains(msg, "did not answer within 2s (--etcd-timeout)") {
		t.Fatalf("error %q does not name the step and the bound", msg)
	}
	if stdout.Len() != 0 {
		t.Fatalf("stdout %q", stdout.String())
	}
}

func TestReadyLineRoundTrip(t *testing.T) {
	line := readyLine(node.Addrs{Node: "n3", TCP: "127.0.0.1:1", HTTP: "127.0.0.1:2"})
	if line != "ready node=n3 tcp=127.0.0.1:1 http=127.0.0.1:2" {
		t.Fatalf("ready line %q", line)
	}
	r, ok := demo.ParseReadyLine(line)
	if !ok || r != (demo.ReadyLine{Node: "n3", TCP: "127.0.0.1:1", HTTP: "127.0.0.1:2"}) {
		t.Fatalf("parsed %+v %v", r, ok)
	}
	for _, bad := range []string{"", "ready", "ready node=n1", "ready node=n1 tcp=a", "time=x msg=ready node=n1 tcp=a http=b"} {
		if _, ok := demo.ParseReadyLine(bad); ok {
			t.Errorf("ParseReadyLine(%q) accepted", bad)
		}
	}
}

func TestDemoFlags(t *testing.T) {
	fs := newFlagSet("demo", &bytes.Buffer{})
	f := newDemoFlags(fs)
	if err := fs.Parse([]string{"--nodes", "4", "--partitions", "8", "--replicas", "3", "--rows", "10", "--value-bytes", "20",
		"--write-rate", "500", "--fault", "kill-source", "--json", "--keep", "--dir", "/x", "--timeout", "1m"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Binary = "/bin/true"
	if err := cfg.Check(); err != nil {
		t.Fatal(err)
	}
	if cfg.Nodes != 4 || cfg.Partitions != 8 || cfg.Replicas != 3 || cfg.Rows != 10 || cfg.ValueBytes != 20 ||
		cfg.WriteRate != 500 || cfg.Fault != demo.FaultKillSource || !cfg.JSON || cfg.Progress || !cfg.Keep ||
		cfg.Dir != "/x" || cfg.Timeout != time.Minute || cfg.IncomingMax != 8 {
		t.Fatalf("config %+v", cfg)
	}
}

func TestVerifyVerdict(t *testing.T) {
	ok := clusterview.DigestReport{Partitions: []clusterview.PartitionDigests{{Partition: 0, Match: true}}}
	if err := verdict(ok); err != nil {
		t.Fatalf("verdict of a match: %v", err)
	}
	bad := clusterview.DigestReport{Partitions: []clusterview.PartitionDigests{{Partition: 0, Match: true}, {Partition: 3, Differ: true}, {Partition: 5, Differ: true}}, Bad: []uint32{3, 5}}
	if err := verdict(bad); !errors.Is(err, errMismatch) || !strings.Contains(err.Error(), "partitions [3 5]") {
		t.Fatalf("verdict of a mismatch: %v", err)
	}
	var ee *exitError
	// Nothing read is no mismatch: issue 28 saw every node down reported
	// as 'digests do not match: partitions [0 … 15]'.
	down := clusterview.DigestReport{Partitions: []clusterview.PartitionDigests{{Partition: 0, Problem: "client: no reachable node"}, {Partition: 1, Problem: "client: no reachable node"}}, Bad: []uint32{0, 1}}
	if err := verdict(down); errors.Is(err, errMismatch) || !errors.As(err, &ee) || ee.code != exitUncertain || !strings.Contains(err.Error(), "unreachable (partition 0: client: no reachable node)") {
		t.Fatalf("verdict with every node down: %v", err)
	}
	short := clusterview.DigestReport{Partitions: []clusterview.PartitionDigests{{Partition: 0, Match: true}, {Partition: 1, Problem: "1 answers, 2 live replicas"}}, Bad: []uint32{1}}
	if err := verdict(short); errors.Is(err, errMismatch) || !errors.As(err, &ee) || ee.code != exitUncertain || !strings.Contains(err.Error(), "partitions [1] could not be compared") {
		t.Fatalf("verdict of a partition short of answers: %v", err)
	}
	both := clusterview.DigestReport{Partitions: []clusterview.PartitionDigests{{Partition: 0, Differ: true}, {Partition: 1}}, Bad: []uint32{0, 1}}
	if err := verdict(both); !errors.Is(err, errMismatch) || !strings.Contains(err.Error(), "partitions [0] (and partitions [1] could not be compared)") {
		t.Fatalf("verdict of a mismatch and an unread partition: %v", err)
	}
	if err := verdict(clusterview.DigestReport{}); err == nil || errors.Is(err, errMismatch) {
		t.Fatalf("verdict of nothing: %v", err)
	}
}
