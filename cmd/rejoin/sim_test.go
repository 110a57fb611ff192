package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/recovery/sim"
)

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func TestSimPasses(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out, errOut bytes.Buffer
	if code := run([]string{"sim", "--seeds", "4", "--start", "10"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	if got := out.String(); got != "4 seeds, 0 failures\n" {
		t.Fatalf("stdout %q, want the summary line alone", got)
	}
}

func TestSimReplayOneSeed(t *testing.T) {
	defer goleak.VerifyNone(t)
	var a, b, errOut bytes.Buffer
	if code := run([]string{"sim", "--seed", "9", "-v"}, &a, &errOut); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	run([]string{"sim", "--seed", "9", "-v"}, &b, &errOut)
	if a.String() != b.String() {
		t.Fatal("two replays of seed 9 print different traces")
	}
	if !strings.Contains(a.String(), "setup seed=9 ") || !strings.Contains(a.String(), "seed 9: ok in ") {
		t.Fatalf("no trace or result line in:\n%s", a.String())
	}
	if got := lastLine(a.String()); got != "1 seeds, 0 failures" {
		t.Fatalf("last line %q", got)
	}
}

// TestSimReportsFailure forces a broken invariant on two seeds through the
// unexported hook: the command prints each failure with the command that
// replays it, ends with the summary, and exits 1.
func TestSimReportsFailure(t *testing.T) {
	defer goleak.VerifyNone(t)
	saved := simOptions
	defer func() { simOptions = saved }()
	simOptions = func(seed uint64) sim.Options {
		if seed == 3 || seed == 5 {
			return sim.Options{Sabotage: sim.SabotageDestinationWrite}
		}
		return sim.Options{}
	}
	var out, errOut bytes.Buffer
	code := run([]string{"sim", "--seeds", "5", "--workers", "3"}, &out, &errOut)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stdout %q", code, out.String())
	}
	got := out.String()
	for _, want := range []string{"seed 3: FAIL ", "invariant a:", "  replay: rejoin sim --seed 3 -v\n", "seed 5: FAIL ", "  replay: rejoin sim --seed 5 -v\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("stdout lacks %q:\n%s", want, got)
		}
	}
	if strings.Index(got, "seed 3:") > strings.Index(got, "seed 5:") {
		t.Errorf("failures out of seed order:\n%s", got)
	}
	if l := lastLine(got); l != "5 seeds, 2 failures" {
		t.Errorf("last line %q, want the summary", l)
	}
	if !strings.Contains(errOut.String(), "2 of 5 seeds failed") {
		t.Errorf("stderr %q", errOut.String())
	}
	// The replay command it printed reproduces the failure.
	out.Reset()
	if code := run([]string{"sim", "--seed", "3", "-v"}, &out, &errOut); code != 1 || !strings.Contains(out.String(), "SABOTAGE") {
		t.Errorf("replay exit %d, output:\n%s", code, out.String())
	}
}

func TestSimUsage(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		code     int
		stderrIn string
	}{
		{[]string{"sim"}, 2, "either --seeds N or --seed S"},
		{[]string{"sim", "--seeds", "2", "--seed", "3"}, 2, "either --seeds N or --seed S"},
		{[]string{"sim", "--seeds", "2", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"sim", "--seeds", "2", "--workers", "0"}, 2, "--workers"},
		{[]string{"sim", "-h"}, 0, "rejoin sim --seed S [-v]"},
		{[]string{"sim", "--bogus"}, 2, "flag provided but not defined"},
	} {
		var out, errOut bytes.Buffer
		if code := run(tt.args, &out, &errOut); code != tt.code || !strings.Contains(errOut.String(), tt.stderrIn) {
			t.Errorf("run(%q) = %d, stderr %q; want %d and %q", tt.args, code, errOut.String(), tt.code, tt.stderrIn)
		}
	}
}
