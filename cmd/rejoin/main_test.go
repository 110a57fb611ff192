package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRunDispatch(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		stdout   string
		stderrIn string
	}{
		{args: nil, code: 2, stderrIn: "usage: rejoin"},
		{args: []string{"--help"}, code: 0, stderrIn: "commands:"},
		{args: []string{"nope"}, code: 2, stderrIn: `unknown command "nope"`},
		{args: []string{"version"}, code: 0, stdout: "rejoin dev\n"},
		{args: []string{"demo"}, code: 0, stdout: "not built yet"},
		{args: []string{"demo", "extra"}, code: 2, stderrIn: `unexpected argument "extra"`},
		{args: []string{"demo", "--bogus"}, code: 2, stderrIn: "flag provided but not defined"},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		code := run(tt.args, &out, &errOut)
		if code != tt.code {
			t.Errorf("run(%q) = %d, want %d (stderr %q)", tt.args, code, tt.code, errOut.String())
		}
		if tt.stdout != "" && !strings.Contains(out.String(), tt.stdout) {
			t.Errorf("run(%q) stdout %q, want it to contain %q", tt.args, out.String(), tt.stdout)
		}
		if tt.stderrIn != "" && !strings.Contains(errOut.String(), tt.stderrIn) {
			t.Errorf("run(%q) stderr %q, want it to contain %q", tt.args, errOut.String(), tt.stderrIn)
		}
	}
}
