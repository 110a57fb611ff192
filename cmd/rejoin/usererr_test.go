package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// internalWords are what a message about the user's flags must not say:
// packages' error classes, Go's parsers, a package name repeated.
var internalWords = []string{"bad config", "bad identity", "invalid config", "placement:", "move refused", "slog:", "strconv", "demo: ", "chaos: ", "bench: ", "stream: listen", "nodestate:"}

func checkUserMessage(t *testing.T, args []string, code int, want string) {
	t.Helper()
	var out, errOut bytes.Buffer
	got := run(args, &out, &errOut)
	msg := errOut.String()
	if got != code || !strings.Contains(msg, want) {
		t.Errorf("rejoin %q: exit %d, stderr %q; want exit %d and %q", args, got, msg, code, want)
	}
	// The usage text after a message is the command's own: only the first
	// line is the message.
	first, _, _ := strings.Cut(msg, "\n")
	_, said, _ := strings.Cut(first, ": ") // after "rejoin NAME: "
	for _, w := range internalWords {
		if strings.Contains(said, w) {
			t.Errorf("rejoin %q: %q says %q", args, first, w)
		}
	}
}

// TestUserMessages: a flag out of range is said with the flag, what it
// wants and nothing of the packages that refused it (issue 28: --replicas
// 0 said "layout: bad config: supervise: placement:", the demo "demo:
// demo:", bench Go's field names, node slog's and the listener's words).
func TestUserMessages(t *testing.T) {
	certsDir := filepath.Join(t.TempDir(), "certs")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"demo", "--nodes", "70"}, "rejoin demo: --nodes 70, want 2..64"},
		{[]string{"demo", "--rows", "-1"}, "rejoin demo: --rows -1: want 0 or more"},
		{[]string{"demo", "--writers", "5000"}, "rejoin demo: --writers 5000: want 1..4096"},
		{[]string{"demo", "--plot", "x.txt"}, `rejoin demo: --plot "x.txt": want a file name ending in .png`},
		{[]string{"chaos", "--nodes", "1"}, "rejoin chaos: --nodes 1, want 2..64"},
		{[]string{"chaos", "--rows", "-5"}, "rejoin chaos: --rows -5: want 0 or more"},
		{[]string{"bench", "--rows", "0"}, "rejoin bench: --rows 0, want >= 1"},
		{[]string{"bench", "--window", "-3"}, "rejoin bench: --window -3, want >= 1"},
		{[]string{"bench", "--block-bytes", "-1"}, "--block-bytes -1, want 1.."},
		{[]string{"bench", "--redis", "--rows", "0"}, "rejoin bench: --rows 0: want 1 or more"},
		{[]string{"bench", "--processes", "--write-rate", "0"}, "rejoin bench: --write-rate 0: the bench offers a fixed rate"},
		{[]string{"cert", "create-node", "0", "--certs-dir", certsDir}, `rejoin cert: node name "n0", want n<N> with N in 1..1023`},
		{[]string{"access", "--etcd", "http://127.0.0.1:1", "--reader", "a:b"}, `rejoin access: client name "a:b", want 1-64 of`},
		{[]string{"init", "--etcd", "http://127.0.0.1:1", "--table", "t(a int)"}, `unknown column type "int"`},
		{[]string{"node", "--id", "5000", "--etcd", "http://127.0.0.1:1", "--data", "d", "--insecure"}, "rejoin node: --id 5000: want 1..1023"},
		{[]string{"node", "--id", "-1", "--etcd", "http://127.0.0.1:1", "--data", "d", "--insecure"}, "rejoin node: --id -1: want 1..1023"},
		{[]string{"node", "--id", "1", "--etcd", "http://127.0.0.1:1", "--data", "d", "--insecure", "--listen", "nonsense"}, `rejoin node: --listen "nonsense": no port; want HOST:PORT`},
		{[]string{"node", "--id", "1", "--etcd", "http://127.0.0.1:1", "--data", "d", "--insecure", "--http", "127.0.0.1:99999"}, `rejoin node: --http "127.0.0.1:99999": port "99999" is not a number 0..65535`},
		{[]string{"node", "--id", "1", "--etcd", "http://127.0.0.1:1", "--data", "d", "--insecure", "--log-level", "loud"}, `rejoin node: --log-level "loud": want debug, info, warn or error`},
	} {
		checkUserMessage(t, tc.args, 2, tc.want)
	}
}

// TestNodeUserMessagesPastEtcd: what the node itself refuses once etcd
// answers is said with the flag too: its config's fields (ApplyMax,
// NodeConnsReserved) as the flags that set them, a data directory it
// cannot make as --data rather than as the store's error.
func TestNodeUserMessagesPastEtcd(t *testing.T) {
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	ep := strings.Join(e.Endpoints(), ",")
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"node", "--id", "1", "--etcd", ep, "--insecure"}
	checkUserMessage(t, append(base, "--data", t.TempDir(), "--apply-max", "-1"), 2, "rejoin node: --apply-max -1, want >= 1")
	checkUserMessage(t, append(base, "--data", t.TempDir(), "--conns-max", "4", "--node-conns", "9"), 2, "rejoin node: --node-conns 9 of --conns-max 4 leaves clients no slot")
	checkUserMessage(t, append(base, "--data", filepath.Join(notDir, "d")), 1, "rejoin node: --data "+filepath.Join(notDir, "d")+": cannot make the data directory")
}

// TestShellDecodeMessage: a key or value that is not of its column's
// type says what the column wants, not Go's parser's words.
func TestShellDecodeMessage(t *testing.T) {
	s := &shell{}
	for _, tc := range []struct {
		col  layout.Column
		text string
		want string
	}{
		{layout.Column{Name: "id", Type: "int64"}, "abc", `key "abc": column id is int64: want a 64-bit integer, such as -12 or 40000`},
		{layout.Column{Name: "id", Type: "int64"}, "99999999999999999999", `column id is int64: want a 64-bit integer`},
		{layout.Column{Name: "x", Type: "float64"}, "1,5", `key "1,5": column x is float64: want a number, such as -1.5 or 2e9`},
	} {
		_, err := s.decode("key", tc.col, tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "strconv") {
			t.Errorf("decode %q as %s: %v; want %q", tc.text, tc.col.Type, err, tc.want)
		}
	}
}

// TestUserMessage: the quiet classes go, wherever they stand in the chain;
// the command's name is not repeated; fields become their flags, whole
// words only; the other classes stay.
func TestUserMessage(t *testing.T) {
	var cfg struct {
		Rows     int
		RowsMax  int
		Other    int
		Disabled bool
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.IntVar(&cfg.Rows, "rows", 0, "")
	fs.IntVar(&cfg.RowsMax, "rows-max", 0, "")
	fs.BoolVar(&cfg.Disabled, "off", false, "")
	fields := flagFields(fs, &cfg)
	if len(fields) != 3 || fields["Rows"] != "--rows" || fields["RowsMax"] != "--rows-max" || fields["Disabled"] != "--off" {
		t.Fatalf("flagFields = %v", fields)
	}
	for _, tc := range []struct {
		err    error
		name   string
		fields map[string]string
		want   string
	}{
		{fmt.Errorf("%w: %w: 3 replicas on 2 nodes", layout.ErrConfig, supervise.ErrPlacement), "init", nil, "3 replicas on 2 nodes"},
		{fmt.Errorf("%w: partition 0: no move under way", supervise.ErrMove), "undo-move", nil, "partition 0: no move under way"},
		{errors.New("demo: --nodes 70, want 2..64"), "demo", nil, "--nodes 70, want 2..64"},
		{errors.New("demo: --nodes 70"), "chaos", nil, "demo: --nodes 70"},
		{errors.New("bench: Rows 0 and RowsMax 1, Other 2, Rowsy 3"), "bench", fields, "--rows 0 and --rows-max 1, Other 2, Rowsy 3"},
		{fmt.Errorf("via n1: %w", supervise.ErrNodeLost), "get", nil, "via n1: " + supervise.ErrNodeLost.Error()},
	} {
		if got := userMessage(tc.name, tc.err, tc.fields); got != tc.want {
			t.Errorf("userMessage(%q, %q) = %q, want %q", tc.name, tc.err, got, tc.want)
		}
	}
}
