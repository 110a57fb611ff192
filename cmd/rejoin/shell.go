package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/wire"
)

// Exit statuses of the shell client beyond 0, 1 and 2 (see doc.go).
const (
	// exitUncertain: a write was sent and no answer came; it may or may
	// not have happened.
	exitUncertain = 3
	// exitNotFound: the key is not there.
	exitNotFound = 4
	// exitDown: status found no node registered: the cluster serves
	// nothing.
	exitDown = 5
	// exitInterrupted: a command stopped by SIGINT (Ctrl-C) before it
	// was done, as shells report 128+2.
	exitInterrupted = 130
)

// exitError is an error with its own exit status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

const shellUsage = `usage: rejoin %s --etcd ENDPOINTS [flags] %s

%s

Keys and values are text by default; --hex and --base64 read and print
them in those encodings. A value that is not text (not UTF-8, or with
control characters) is printed in hex unless asked otherwise (--raw: its
bytes as they are). --table names another table of two columns, the
first its key; int64, float64 and string columns are read and printed as
text. Each call is bounded by --timeout: an etcd or cluster that does not
answer within it is an error.

Exit status: 0 done; 1 failed (nothing was written); 2 usage;
3 outcome uncertain (the write was sent, no answer came: it may or may not
have happened; read the key to know); 4 the key is not there.

flags:
`

// shellFlags are the flags every shell command shares.
type shellFlags struct {
	etcd    *etcdFlags
	nodeTLS *clientTLSFlags
	table   string
	hex     bool
	base64  bool
	timeout time.Duration
	// valueFile (put): the value is this file's bytes ("-": stdin).
	// raw (get): the value's bytes to stdout as they are.
	valueFile string
	raw       bool
}

func newShellFlags(fs *flag.FlagSet, name string) *shellFlags {
	f := &shellFlags{}
	switch name {
	case "put":
		fs.StringVar(&f.valueFile, "value-file", "", "read the value from `file` ('-': stdin), its bytes as they are, instead of the VALUE argument (up to 4 MiB; a command line holds some 128 KiB)")
	case "get":
		fs.BoolVar(&f.raw, "raw", false, "write the value's bytes to stdout as they are, with no newline, text or not")
	}
	f.etcd = newEtcdFlags(fs)
	f.nodeTLS = newClientTLSFlags(fs, f.etcd)
	fs.StringVar(&f.table, "table", "kv", "the `table`: two columns, the first its key")
	fs.BoolVar(&f.hex, "hex", false, "keys and values in hex")
	fs.BoolVar(&f.base64, "base64", false, "keys and values in base64 (standard, padded)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "bound of the whole command: reading etcd, reaching a node, the answer")
	return f
}

// parseInterspersed parses fs's flags wherever they stand among args and
// returns the other arguments, which must be want many (any number if
// want is negative). "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, name, wantText string, args []string, want int, stderr io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, errUsage
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			pos = append(pos, rest...) // after "--", even "-5" is an argument
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if want >= 0 && len(pos) != want {
		fmt.Fprintf(stderr, "rejoin %s: want %s, got %d arguments\n", name, wantText, len(pos))
		return nil, errUsage
	}
	return pos, nil
}

// shell is an open client of a cluster for one command.
type shell struct {
	name  string
	flags *shellFlags
	cli   *clientv3.Client
	c     *client.Client
	ctx   context.Context
	done  func()
	key   layout.Column
	value layout.Column
	// stderr is where a wait says what it waits for.
	stderr io.Writer
}

// openShell connects to the cluster of --etcd, bounded by --timeout, and
// finds --table's two columns.
func openShell(name string, f *shellFlags, stderr io.Writer) (*shell, error) {
	if f.hex && f.base64 {
		fmt.Fprintf(stderr, "rejoin %s: --hex and --base64 exclude each other\n", name)
		return nil, errUsage
	}
	if f.timeout <= 0 {
		fmt.Fprintf(stderr, "rejoin %s: --timeout %s: want > 0\n", name, f.timeout)
		return nil, errUsage
	}
	cli, ctx, done, err := openEtcd(name, f.etcd, f.timeout, stderr)
	if err != nil {
		return nil, err
	}
	creds, err := f.nodeTLS.load()
	if err != nil {
		done()
		fmt.Fprintf(stderr, "rejoin %s: %v\n", name, err)
		return nil, errUsage
	}
	s := &shell{name: name, flags: f, cli: cli, ctx: ctx, done: done, stderr: stderr}
	s.c, err = client.Open(ctx, cli, client.Options{Timeout: f.timeout, TLS: creds})
	if err != nil {
		done()
		return nil, s.clusterErr(err)
	}
	var tbl *layout.Table
	for _, t := range s.c.Tables() {
		if t.Name == f.table {
			tbl = &t
		}
	}
	switch {
	case tbl == nil:
		err = fmt.Errorf("the cluster has no table %q", f.table)
	case len(tbl.Columns) != 2 || len(tbl.Key) != 1 || tbl.Key[0] != 0:
		err = fmt.Errorf("table %q is %s: this command takes a table of two columns whose first is the key", f.table, tableSpec(*tbl))
	}
	if err != nil {
		s.close()
		fmt.Fprintf(stderr, "rejoin %s: %v\n", name, err)
		return nil, errUsage
	}
	s.key, s.value = tbl.Columns[0], tbl.Columns[1]
	return s, nil
}

func (s *shell) close() {
	s.c.Close()
	s.done()
}

// clusterErr says plainly what an error reaching the cluster means.
func (s *shell) clusterErr(err error) error {
	ep := s.flags.etcd.endpoints
	switch {
	case errors.Is(err, client.ErrUncertain):
		return &exitError{exitUncertain, fmt.Errorf("outcome uncertain: the call was sent but no answer came within --timeout %s or its connection broke; the write may or may not have happened (read the key to know): %w", s.flags.timeout, err)}
	case errors.Is(err, client.ErrNotFound):
		return &exitError{exitNotFound, err}
	case errors.Is(err, layout.ErrMissing):
		return fmt.Errorf("etcd at %s holds no cluster (create one with rejoin init): %w", ep, err)
	case errors.Is(err, client.ErrNoNode):
		return fmt.Errorf("no node of the cluster could be reached (are they running? rejoin status --etcd %s): %w", ep, err)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(s.ctx.Err(), context.DeadlineExceeded):
		return s.flags.etcd.explain(fmt.Errorf("no answer within --timeout %s (etcd at %s, or the cluster's nodes): %w", s.flags.timeout, ep, err))
	}
	return err
}

// retry runs call again while the cluster refuses it as not bootstrapped
// (a node of the placement never started: nothing was sequenced, and it
// passes once the last node's start reaches the nodes' view of etcd,
// within moments of the last "ready"), or every node refused it for its
// own state (not registered, not ready, stopping),
// within --timeout: a command typed as the nodes come up waits for them
// rather than fail. A read (readOnly) is also run again when its outcome
// is uncertain: it changes nothing, so running it twice is safe.
func (s *shell) retry(readOnly bool, call func() error) error {
	said := ""
	for {
		err := call()
		again := err != nil && (errors.Is(err, client.ErrRefused) || readOnly && errors.Is(err, client.ErrUncertain))
		if !again {
			return err
		}
		if why := waitReason(err); why != said {
			said = why
			fmt.Fprintf(s.stderr, "rejoin %s: waiting (up to --timeout %s): %s\n", s.name, s.flags.timeout, why)
		}
		select {
		case <-s.ctx.Done():
			if readOnly && errors.Is(err, client.ErrUncertain) {
				// Not ErrUncertain: a read that got no answer changed nothing.
				return fmt.Errorf("no answer within --timeout %s (a read: nothing changed): %s", s.flags.timeout, err)
			}
			return fmt.Errorf("%w (waited --timeout %s for every node of the placement to start once)", err, s.flags.timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitReason says in words what a retried call waits for.
func waitReason(err error) string {
	switch {
	case errors.Is(err, client.ErrNotBootstrapped):
		return "the cluster is not bootstrapped yet: a node of its placement has never started"
	case errors.Is(err, client.ErrRefused):
		return "every node refused the call for now (not registered in etcd, not ready, or stopping); nothing was written"
	}
	return "no answer to a read yet; it is asked again"
}

// decode reads a command-line text as a value of column c.
func (s *shell) decode(what string, c layout.Column, text string) (wire.Value, error) {
	switch c.Type {
	case wire.TypeBytes.String():
		var b []byte
		var err error
		switch {
		case s.flags.hex:
			b, err = hex.DecodeString(text)
		case s.flags.base64:
			b, err = base64.StdEncoding.DecodeString(text)
		default:
			b = []byte(text)
		}
		if err != nil {
			return wire.Value{}, fmt.Errorf("%s %q: %w", what, text, err)
		}
		return wire.Bytes(b), nil
	case wire.TypeString.String():
		return wire.String(text), nil
	case wire.TypeInt64.String():
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return wire.Value{}, fmt.Errorf("%s %q: column %s is int64: want a 64-bit integer, such as -12 or 40000", what, text, c.Name)
		}
		return wire.Int64(n), nil
	case wire.TypeFloat64.String():
		x, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return wire.Value{}, fmt.Errorf("%s %q: column %s is float64: want a number, such as -1.5 or 2e9", what, text, c.Name)
		}
		return wire.Float64(x), nil
	}
	return wire.Value{}, fmt.Errorf("column %s: type %s", c.Name, c.Type)
}

// encode prints a value as decode reads it, and says whether it is bytes
// that are not text, printed in hex though no flag asked.
func (s *shell) encode(v wire.Value) (string, bool) {
	switch v.Type {
	case wire.TypeBytes:
		switch {
		case s.flags.hex:
			return hex.EncodeToString(v.Bytes), false
		case s.flags.base64:
			return base64.StdEncoding.EncodeToString(v.Bytes), false
		case !isText(v.Bytes):
			// Not text: raw, it could garble the terminal, and quoted
			// Go-style, no tool reads it back.
			return hex.EncodeToString(v.Bytes), true
		}
		return string(v.Bytes), false
	case wire.TypeString:
		return v.Str, false
	case wire.TypeInt64:
		return strconv.FormatInt(v.Int, 10), false
	case wire.TypeFloat64:
		return strconv.FormatFloat(v.Float, 'g', -1, 64), false
	}
	return fmt.Sprint(v), false
}

// isText reports whether b is UTF-8 with no control character but tab
// and newline.
func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' {
			return false
		}
	}
	return true
}

// runShell parses a shell command's flags and arguments, opens the
// cluster and runs do.
func runShell(name, args1, what string, nargs int, args []string, stdout, stderr io.Writer, do func(s *shell, pos []string) error) error {
	fs := newFlagSet(name, stderr)
	f := newShellFlags(fs, name)
	fs.Usage = func() {
		fmt.Fprintf(stderr, shellUsage, name, args1, what)
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, name, args1, args, -1, stderr)
	if err != nil {
		return err
	}
	if f.valueFile != "" {
		nargs, args1 = nargs-1, "KEY (the value from --value-file)"
	}
	if len(pos) != nargs {
		fmt.Fprintf(stderr, "rejoin %s: want %s, got %d arguments\n", name, args1, len(pos))
		return errUsage
	}
	s, err := openShell(name, f, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	if err := do(s, pos); err != nil {
		var ee *exitError
		if errors.As(err, &ee) || errors.Is(err, errUsage) {
			return err
		}
		return s.clusterErr(err)
	}
	return nil
}

// stdin is what put --value-file - reads; a variable so that tests give
// their own.
var stdin io.Reader = os.Stdin

// valueFromFile reads put's value from --value-file: a bytes column takes
// the bytes as they are (--hex and --base64 are for the key then); any
// other column its text, one trailing newline dropped. More than the
// node's limit is refused before anything is sent.
func (s *shell) valueFromFile(in io.Reader) (wire.Value, error) {
	name := s.flags.valueFile
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return wire.Value{}, fmt.Errorf("--value-file: %w", err)
		}
		defer f.Close()
		in = f
	} else {
		name = "stdin"
	}
	b, err := io.ReadAll(io.LimitReader(in, wire.ProcTupleBytesMax+1))
	if err != nil {
		return wire.Value{}, fmt.Errorf("--value-file %s: %w", name, err)
	}
	if len(b) > wire.ProcTupleBytesMax {
		return wire.Value{}, fmt.Errorf("--value-file %s: more than %d bytes, the most a row holds", name, wire.ProcTupleBytesMax)
	}
	if s.value.Type == wire.TypeBytes.String() {
		return wire.Bytes(b), nil
	}
	text := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	saveHex, saveB64 := s.flags.hex, s.flags.base64
	s.flags.hex, s.flags.base64 = false, false
	defer func() { s.flags.hex, s.flags.base64 = saveHex, saveB64 }()
	return s.decode("value", s.value, text)
}

func runPut(args []string, stdout, stderr io.Writer) error {
	return runShell("put", "KEY VALUE", "Writes VALUE under KEY (an upsert: inserted, or replacing what the key held), one\ntransaction, and prints OK once every live replica has it.", 2, args, stdout, stderr, func(s *shell, pos []string) error {
		k, err := s.decode("key", s.key, pos[0])
		if err == nil {
			var v wire.Value
			if s.flags.valueFile != "" {
				v, err = s.valueFromFile(stdin)
			} else {
				v, err = s.decode("value", s.value, pos[1])
			}
			if err == nil {
				err = s.retry(false, func() error {
					_, err := s.c.Upsert(s.ctx, s.flags.table, k, v)
					return err
				})
				if err == nil {
					fmt.Fprintln(stdout, "OK")
				}
				return err
			}
		}
		fmt.Fprintf(stderr, "rejoin put: %v\n", err)
		return errUsage
	})
}

func runGet(args []string, stdout, stderr io.Writer) error {
	return runShell("get", "KEY", "Prints the value under KEY, or fails with exit status 4 if the key is not there.", 1, args, stdout, stderr, func(s *shell, pos []string) error {
		k, err := s.decode("key", s.key, pos[0])
		if err != nil {
			fmt.Fprintf(stderr, "rejoin get: %v\n", err)
			return errUsage
		}
		var row []wire.Value
		err = s.retry(true, func() (err error) {
			row, err = s.c.Read(s.ctx, s.flags.table, k)
			return err
		})
		if errors.Is(err, client.ErrNotFound) {
			return &exitError{exitNotFound, fmt.Errorf("key %s not found in table %s", pos[0], s.flags.table)}
		}
		if err != nil {
			return err
		}
		if len(row) != 2 {
			return fmt.Errorf("the cluster answered a row of %d values", len(row))
		}
		if s.flags.raw && row[1].Type == wire.TypeBytes {
			_, err := stdout.Write(row[1].Bytes)
			return err
		}
		text, binary := s.encode(row[1])
		if binary {
			fmt.Fprintln(stderr, "rejoin get: the value is not text: printed in hex (--raw writes its bytes as they are)")
		}
		fmt.Fprintln(stdout, text)
		return nil
	})
}

func runDel(args []string, stdout, stderr io.Writer) error {
	return runShell("del", "KEY", "Deletes the row under KEY and prints OK, or fails with exit status 4 if the key is not\nthere (nothing changed).", 1, args, stdout, stderr, func(s *shell, pos []string) error {
		k, err := s.decode("key", s.key, pos[0])
		if err != nil {
			fmt.Fprintf(stderr, "rejoin del: %v\n", err)
			return errUsage
		}
		err = s.retry(false, func() error {
			_, err := s.c.Delete(s.ctx, s.flags.table, k)
			return err
		})
		if errors.Is(err, client.ErrNotFound) {
			return &exitError{exitNotFound, fmt.Errorf("key %s not found in table %s; nothing deleted", pos[0], s.flags.table)}
		}
		if err == nil {
			fmt.Fprintln(stdout, "OK")
		}
		return err
	})
}
