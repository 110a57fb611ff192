package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
)

// TestEveryNodeDownVerdicts: with a cluster in etcd and none of its nodes
// running, status lists the placement's nodes as down and exits 5 saying
// no node is registered (it exited 0 listing none), and verify says no
// partition could be compared, exit 3, not "digests do not match" (it
// printed a mismatch of every partition, having read nothing).
func TestEveryNodeDownVerdicts(t *testing.T) {
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	ep := strings.Join(e.Endpoints(), ",")
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := layout.Init(ctx, cli, layout.Config{Partitions: 4, Replicas: 2, Tables: []layout.Table{layout.KV()}}, []string{"n1", "n2", "n3"}); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := run([]string{"status", "--etcd", ep}, &out, &errOut)
	if code != exitDown || !strings.Contains(errOut.String(), "no node is registered") || !strings.Contains(errOut.String(), "n1, n2, n3") ||
		!strings.Contains(out.String(), "NODES (0 registered, 3 down)") || !strings.Contains(out.String(), "n2  -    -     DOWN (not registered; holds 3 replicas)") {
		t.Fatalf("status with every node down: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	t.Logf("status:\n%s%s", out.String(), errOut.String())
	out.Reset()
	errOut.Reset()
	code = run([]string{"verify", "--etcd", ep, "--insecure", "--timeout", "20s"}, &out, &errOut)
	if code != exitUncertain || strings.Contains(errOut.String(), "do not match") || !strings.Contains(errOut.String(), "no partition could be compared: unreachable") ||
		strings.Contains(out.String(), "MISMATCH") {
		t.Fatalf("verify with every node down: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	t.Logf("verify:\n%s%s", out.String(), errOut.String())
}
