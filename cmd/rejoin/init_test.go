package main

import (
	"bytes"
	"context"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

func TestParseTableSpec(t *testing.T) {
	got, err := parseTableSpec("acct(id int64 key, owner string key, balance float64, blob bytes)")
	if err != nil {
		t.Fatal(err)
	}
	want := layout.Table{Name: "acct", Columns: []layout.Column{{Name: "id", Type: "int64"}, {Name: "owner", Type: "string"},
		{Name: "balance", Type: "float64"}, {Name: "blob", Type: "bytes"}}, Key: []int{0, 1}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parsed %+v, want %+v", got, want)
	}
	if back, err := parseTableSpec(tableSpec(got)); err != nil || !reflect.DeepEqual(back, want) {
		t.Fatalf("round trip through %q: %+v, %v", tableSpec(got), back, err)
	}
	if kv, err := parseTableSpec("kv(k bytes, v bytes)"); err != nil || !reflect.DeepEqual(kv, layout.KV()) {
		t.Fatalf("kv: %+v, %v", kv, err)
	}
	for _, bad := range []string{"", "t", "t(", "(k bytes)", "t(k)", "t(k uuid)", "t(k bytes primary)", "t(k bytes, k bytes)"} {
		if _, err := parseTableSpec(bad); err == nil {
			t.Errorf("parseTableSpec(%q) accepted", bad)
		}
	}
}

func TestParseNodes(t *testing.T) {
	for in, want := range map[string]string{"3": "n1,n2,n3", "n1,n2,n5": "n1,n2,n5", "1, 2,7": "n1,n2,n7", "1": "n1"} {
		got, err := parseNodes(in)
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("parseNodes(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"0", "", "x1", "n0", "n1,,nope", "1024", "n1024"} {
		if got, err := parseNodes(bad); err == nil {
			t.Errorf("parseNodes(%q) = %v, accepted", bad, got)
		}
	}
}

// TestInitCommand: `rejoin init` against an embedded etcd writes a cluster
// that layout reads back with its placement; a second one is refused with
// exit 1, saying what is there; bad flags are usage errors (exit 2).
func TestInitCommand(t *testing.T) {
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	ep := strings.Join(e.Endpoints(), ",")
	var out, errOut bytes.Buffer
	if code := run([]string{"status", "--etcd", ep}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "holds no cluster (create one with rejoin init)") {
		t.Fatalf("status before init: exit %d, stderr %q", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	code := run([]string{"init", "--etcd", ep, "--partitions", "1000", "--replicas", "2", "--nodes", "n1,n2,n4",
		"--table", "kv(k bytes, v bytes)", "--table", "acct(id int64 key, balance int64)"}, &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), "1000 partitions x 2 replicas on n1,n2,n4") {
		t.Fatalf("init: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := layout.Read(ctx, cli)
	if err != nil || cfg.Partitions != 1000 || cfg.Replicas != 2 || len(cfg.Tables) != 2 || cfg.Tables[1].Name != "acct" {
		t.Fatalf("read back %+v, %v", cfg, err)
	}
	reps, err := supervise.Replicas(ctx, cli)
	if err != nil || len(reps) != 2000 {
		t.Fatalf("%d replicas, %v", len(reps), err)
	}
	out.Reset()
	errOut.Reset()
	// No node started yet: status lists them down and exits 5.
	if code := run([]string{"status", "--etcd", ep}, &out, &errOut); code != exitDown || !strings.Contains(out.String(), "REPLICAS (2000)") {
		t.Fatalf("status after init: exit %d, stdout %.300q, stderr %q", code, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"init", "--etcd", ep, "--partitions", "8"}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "already holds a cluster (1000 partitions x 2 replicas); nothing changed") {
		t.Fatalf("second init: exit %d, stderr %q", code, errOut.String())
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"init"}, "--etcd is required"},
		{[]string{"init", "--etcd", ep, "--replicas", "4"}, "--replicas 4 with 3 nodes: want 1..3"},
		{[]string{"init", "--etcd", ep, "--replicas", "0"}, "--replicas 0 with 3 nodes: want 1..3"},
		{[]string{"init", "--etcd", ep, "--partitions", "0"}, "--partitions 0"},
		{[]string{"init", "--etcd", ep, "--nodes", "n1,x"}, `"x" is not a node id`},
		{[]string{"init", "--etcd", ep, "--table", "t(k uuid)"}, `unknown column type "uuid"`},
	} {
		errOut.Reset()
		if code := run(tc.args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("run(%q): exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
		// The packages' error classes are no help to whoever typed the
		// flags: "layout: bad config: supervise: placement: ..." before.
		for _, internal := range []string{"layout:", "supervise:", "partition:"} {
			if strings.Contains(errOut.String(), internal) {
				t.Errorf("run(%q): stderr %q names the package %s", tc.args, errOut.String(), internal)
			}
		}
	}
}

// TestInitUnreachableEtcd: with nothing at --etcd, init fails at once
// naming the refused connection; with an etcd that takes the connection
// and never answers, within its --timeout, naming that.
func TestInitUnreachableEtcd(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"init", "--etcd", "http://127.0.0.1:1", "--timeout", "1m"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "connection refused") {
		t.Fatalf("nothing at --etcd: exit %d, stderr %q", code, errOut.String())
	}
	// A listener that takes connections and says nothing: its connections
	// are held until it closes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() {
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
	})
	out.Reset()
	errOut.Reset()
	start := time.Now()
	code = run([]string{"init", "--etcd", "http://" + ln.Addr().String(), "--timeout", "1s"}, &out, &errOut)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("took %s", took)
	}
	if code != 1 || !strings.Contains(errOut.String(), "did not answer within 1s (--timeout)") {
		t.Fatalf("a silent etcd: exit %d, stderr %q", code, errOut.String())
	}
}
