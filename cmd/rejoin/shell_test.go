package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/client/clienttest"
	"github.com/rejoin-db/rejoin/wire"
)

func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
		hex  bool
	}{
		{[]string{"k", "v"}, "k v", false},
		{[]string{"--hex", "k", "v"}, "k v", true},
		{[]string{"k", "--hex", "v"}, "k v", true},
		{[]string{"k", "v", "--hex"}, "k v", true},
		{[]string{"--hex", "--", "-k", "-v"}, "-k -v", true},
		{[]string{"k", "--", "--hex"}, "k --hex", false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		hex := fs.Bool("hex", false, "")
		pos, err := parseInterspersed(fs, "put", "KEY VALUE", tc.args, 2, io.Discard)
		if err != nil || strings.Join(pos, " ") != tc.want || *hex != tc.hex {
			t.Errorf("%q: %q hex=%v, %v; want %q hex=%v", tc.args, pos, *hex, err, tc.want, tc.hex)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var errOut bytes.Buffer
	if _, err := parseInterspersed(fs, "get", "KEY", []string{"a", "b"}, 1, &errOut); err != errUsage || !strings.Contains(errOut.String(), "want KEY, got 2 arguments") {
		t.Fatalf("two keys: %v, %q", err, errOut.String())
	}
}

// fakeCluster starts etcd and two fake nodes (clienttest) holding table
// kv and an int64 -> string table; hook picks what the nodes do with a
// call. It returns the etcd endpoints.
func fakeCluster(t *testing.T, hook clienttest.Hook) string {
	t.Helper()
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	names := partition.Schema{Name: "names", Columns: []partition.Column{{Name: "id", Type: wire.TypeInt64}, {Name: "name", Type: wire.TypeString}}, Key: []int{0}}
	cl, err := clienttest.NewCluster(4, clienttest.KVSchema(), names)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := clienttest.WriteCluster(ctx, cli, 4, clienttest.KVSchema(), names); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"n1", "n2"} {
		n, err := clienttest.StartNode(cl, id, hook)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		if err := clienttest.RegisterNode(ctx, cli, id, n.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(e.Endpoints(), ",")
}

type runResult struct {
	code           int
	stdout, stderr string
}

func runArgs(args ...string) runResult {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return runResult{code, out.String(), errOut.String()}
}

// TestShellCommands: put, get and del through the command's own run,
// against fake nodes: text, hex and base64, another table's types, a
// missing key (exit 4), bad input (exit 2).
func TestShellCommands(t *testing.T) {
	ep := fakeCluster(t, nil)
	valueFile, bigFile := filepath.Join(t.TempDir(), "value"), filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(valueFile, []byte("line one\nline two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bigFile, make([]byte, wire.ProcTupleBytesMax+1), 0o644); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin = os.Stdin }()
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"get", "--etcd", ep, "--insecure", "greeting"}, 4, "", "key greeting not found in table kv"},
		{[]string{"put", "--etcd", ep, "--insecure", "greeting", "hello world"}, 0, "OK\n", ""},
		{[]string{"get", "greeting", "--etcd", ep, "--insecure"}, 0, "hello world\n", ""},
		{[]string{"get", "--etcd", ep, "--insecure", "--hex", "6772656574696e67"}, 0, "68656c6c6f20776f726c64\n", ""},
		{[]string{"put", "--etcd", ep, "--insecure", "--base64", "AP8=", "/w=="}, 0, "OK\n", ""},
		{[]string{"get", "--etcd", ep, "--insecure", "--hex", "00ff"}, 0, "ff\n", ""},
		{[]string{"get", "--etcd", ep, "--insecure", "--base64", "AP8="}, 0, "/w==\n", ""},
		{[]string{"put", "--etcd", ep, "--insecure", "--hex", "00ff", "41"}, 0, "OK\n", ""},
		{[]string{"get", "--etcd", ep, "--insecure", "--base64", "AP8="}, 0, "QQ==\n", ""},
		{[]string{"put", "--etcd", ep, "--insecure", "--hex", "zz", "41"}, 2, "", `key "zz"`},
		{[]string{"put", "--etcd", ep, "--insecure", "k"}, 2, "", "want KEY VALUE, got 1 arguments"},
		{[]string{"put", "--etcd", ep, "--insecure", "--table", "names", "7", "seven"}, 0, "OK\n", ""},
		{[]string{"get", "--etcd", ep, "--insecure", "--table", "names", "7"}, 0, "seven\n", ""},
		{[]string{"put", "--etcd", ep, "--insecure", "--table", "names", "x", "seven"}, 2, "", "column id is int64"},
		{[]string{"put", "--etcd", ep, "--insecure", "--table", "nope", "1", "2"}, 2, "", `the cluster has no table "nope"`},
		{[]string{"del", "--etcd", ep, "--insecure", "greeting"}, 0, "OK\n", ""},
		{[]string{"del", "--etcd", ep, "--insecure", "greeting"}, 4, "", "key greeting not found in table kv; nothing deleted"},
		{[]string{"get", "--etcd", ep, "--insecure", "greeting"}, 4, "", "not found"},
		{[]string{"get", "--etcd", ep, "--insecure", "--hex", "--base64", "00"}, 2, "", "exclude each other"},
		{[]string{"get", "x"}, 2, "", "--etcd is required"},
		// A value not text prints in hex, saying so on stderr, unless
		// asked (--raw); it used to print Go-quoted ("\x00\xff").
		{[]string{"put", "--etcd", ep, "--insecure", "--hex", "62696e", "00ff1b"}, 0, "OK\n", ""},
		{[]string{"get", "--etcd", ep, "--insecure", "bin"}, 0, "00ff1b\n", "not text: printed in hex"},
		{[]string{"get", "--etcd", ep, "--insecure", "--raw", "bin"}, 0, "\x00\xff\x1b", ""},
		// put takes the value from a file or stdin.
		{[]string{"put", "--etcd", ep, "--insecure", "--value-file", valueFile, "fromfile"}, 0, "OK\n", ""},
		{[]string{"get", "--etcd", ep, "--insecure", "--raw", "fromfile"}, 0, "line one\nline two\n", ""},
		{[]string{"put", "--etcd", ep, "--insecure", "--value-file", "-", "fromstdin"}, 0, "OK\n", ""},
		{[]string{"get", "--etcd", ep, "--insecure", "--raw", "fromstdin"}, 0, "from stdin\n", ""}, // the bytes as they came, newline too
		{[]string{"put", "--etcd", ep, "--insecure", "--table", "names", "--value-file", "-", "8"}, 0, "OK\n", ""},
		{[]string{"get", "--etcd", ep, "--insecure", "--table", "names", "8"}, 0, "from stdin\n", ""},
		{[]string{"put", "--etcd", ep, "--insecure", "--value-file", valueFile, "k", "v"}, 2, "", "want KEY (the value from --value-file), got 2 arguments"},
		{[]string{"put", "--etcd", ep, "--insecure", "--value-file", bigFile, "big"}, 2, "", "more than 4194304 bytes"},
		{[]string{"get", "--etcd", ep, "--insecure", "--value-file", valueFile, "k"}, 2, "", "flag provided but not defined: -value-file"},
	} {
		stdin = strings.NewReader("from stdin\n")
		r := runArgs(tc.args...)
		if r.code != tc.code || r.stdout != tc.stdout && tc.stdout != "" || !strings.Contains(r.stderr, tc.stderr) {
			t.Errorf("rejoin %q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
		}
	}
}

// TestShellUncertain: a put whose node executes it and then drops the
// connection unanswered says so plainly and exits 3, apart from failures;
// the value is there all the same. A get that gets no answer asks again
// (a read changes nothing), and without any answer fails with exit 1,
// not 3.
func TestShellUncertain(t *testing.T) {
	var dropWrites atomic.Bool
	var dropReads atomic.Int64 // reads to drop
	ep := fakeCluster(t, func(_ string, c *wire.Call) (clienttest.Action, time.Duration) {
		switch {
		case dropWrites.Load() && c.Proc == partition.ProcUpsert:
			return clienttest.DropAfter, 0
		case c.Proc == partition.ProcRead && dropReads.Add(-1) >= 0:
			return clienttest.DropAfter, 0
		}
		return clienttest.Answer, 0
	})
	dropWrites.Store(true)
	r := runArgs("put", "--etcd", ep, "--insecure", "k", "v")
	if r.code != exitUncertain || !strings.Contains(r.stderr, "outcome uncertain") || !strings.Contains(r.stderr, "may or may not have happened") {
		t.Fatalf("uncertain put: %+v", r)
	}
	dropWrites.Store(false)
	dropReads.Store(2)
	// It says what it waits for, once, rather than wait without a word.
	if r := runArgs("get", "--etcd", ep, "--insecure", "k"); r.code != 0 || r.stdout != "v\n" || strings.Count(r.stderr, "waiting (up to --timeout 10s): no answer to a read yet") != 1 {
		t.Fatalf("get after an uncertain put that happened, its first two reads unanswered: %+v", r)
	}
	dropReads.Store(1 << 30)
	r = runArgs("get", "--etcd", ep, "--insecure", "--timeout", "1s", "k")
	if r.code != 1 || !strings.Contains(r.stderr, "no answer within --timeout 1s (a read: nothing changed)") {
		t.Fatalf("get never answered: %+v", r)
	}
}

// TestShellUnreachable: no etcd, no cluster, no node: each a clear error
// (exit 1) within the bound.
func TestShellUnreachable(t *testing.T) {
	start := time.Now()
	r := runArgs("get", "--etcd", "http://127.0.0.1:1", "--insecure", "--timeout", "1s", "k")
	if took := time.Since(start); took > 6*time.Second {
		t.Fatalf("took %s", took)
	}
	if r.code != 1 || !strings.Contains(r.stderr, "connection refused") {
		t.Fatalf("no etcd: %+v", r)
	}

	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	ep := strings.Join(e.Endpoints(), ",")
	if r := runArgs("get", "--etcd", ep, "--insecure", "k"); r.code != 1 || !strings.Contains(r.stderr, "holds no cluster (create one with rejoin init)") {
		t.Fatalf("no cluster: %+v", r)
	}
	if r := runArgs("init", "--etcd", ep); r.code != 0 {
		t.Fatalf("init: %+v", r)
	}
	for _, args := range [][]string{{"get", "k"}, {"load", "--rows", "10"}} {
		r := runArgs(append(args, "--etcd", ep, "--insecure", "--timeout", "2s")...)
		if r.code != 1 || !strings.Contains(r.stderr, "no node of the cluster could be reached") {
			t.Fatalf("%s with no node: %+v", args[0], r)
		}
	}
}

// TestLoadCommand: rejoin load writes its rows and reports them, as text
// and as JSON.
func TestLoadCommand(t *testing.T) {
	ep := fakeCluster(t, nil)
	r := runArgs("load", "--etcd", ep, "--insecure", "--rows", "300", "--writers", "4")
	if r.code != 0 || !strings.Contains(r.stdout, "wrote 300 of 300 rows") || !strings.Contains(r.stdout, "p99") {
		t.Fatalf("load: %+v", r)
	}
	r = runArgs("load", "--etcd", ep, "--insecure", "--rows", "200", "--rate", "400", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"written": 200`) || !strings.Contains(r.stdout, `"p99_ms"`) {
		t.Fatalf("load --json: %+v", r)
	}
	r = runArgs("load", "--etcd", ep, "--insecure", "--rows", "1000", "--batch", "300")
	if r.code != 0 || !strings.Contains(r.stdout, "loaded 1000 of 1000 rows") || !strings.Contains(r.stdout, "in batches of 300 rows") {
		t.Fatalf("load --batch: %+v", r)
	}
	r = runArgs("load", "--etcd", ep, "--insecure", "--rows", "1000", "--batch", "256", "--json")
	if r.code != 0 || !strings.Contains(r.stdout, `"written": 1000`) || !strings.Contains(r.stdout, `"batch_rows": 256`) {
		t.Fatalf("load --batch --json: %+v", r)
	}
	for _, bad := range [][]string{{"--rows", "0"}, {"--writers", "0"}, {"--rate", "-1"}, {"--key-bytes", "4"}, {"--batch", "-1"}, {"--batch", "10", "--rate", "5"}} {
		if r := runArgs(append([]string{"load", "--etcd", ep, "--insecure"}, bad...)...); r.code != 2 {
			t.Errorf("load %q: %+v", bad, r)
		}
	}
}
