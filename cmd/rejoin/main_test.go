package main

import (
	"bytes"
	"runtime"
	"runtime/debug"
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
		{args: []string{"--help"}, code: 0, stderrIn: "130  interrupted by Ctrl-C"},
		{args: []string{"nope"}, code: 2, stderrIn: `unknown command "nope"`},
		{args: []string{"version"}, code: 0, stdout: "rejoin "},
		{args: []string{"--version"}, code: 0, stdout: " commit "},
		{args: []string{"version"}, code: 0, stdout: runtime.Version()},
		{args: []string{"help", "put"}, code: 0, stderrIn: "usage: rejoin put"},
		{args: []string{"help", "status"}, code: 0, stderrIn: "usage: rejoin status"},
		{args: []string{"help", "nope"}, code: 2, stderrIn: `unknown command "nope"`},
		{args: []string{"help"}, code: 0, stderrIn: "etcd       run the embedded etcd"},
		{args: []string{"demo", "--fault", "kill-source", "--replicas", "2"}, code: 2, stderrIn: "needs --replicas >= 3: with 2 replicas the source is the only live copy"},
		{args: []string{"demo", "--fault", "bogus"}, code: 2, stderrIn: `unknown fault "bogus"`},
		{args: []string{"demo", "--replicas", "4", "--nodes", "3"}, code: 2, stderrIn: "each replica of a partition needs its own node"},
		{args: []string{"demo", "--partitions", "0"}, code: 2, stderrIn: "--partitions 0"},
		{args: []string{"demo", "--replicas", "0"}, code: 2, stderrIn: "--replicas 0, want 2 or more"},
		{args: []string{"node", "--etcd", "x", "--data", "d"}, code: 2, stderrIn: "--id is required"},
		{args: []string{"node", "--id", "1", "--data", "d"}, code: 2, stderrIn: "--etcd is required"},
		{args: []string{"node", "--id", "1", "--etcd", "x"}, code: 2, stderrIn: "--data is required"},
		{args: []string{"node", "--id", "1", "--etcd", "x", "--data", "d", "--insecure", "--log-format", "xml"}, code: 2, stderrIn: "want text or json"},
		{args: []string{"node", "--id", "1", "--etcd", "x", "--data", "d"}, code: 2, stderrIn: "--certs-dir is required (create the certificates with `rejoin cert`), or --insecure"},
		{args: []string{"node", "--id", "1", "--etcd", "x", "--data", "d", "--insecure", "--certs-dir", "c"}, code: 2, stderrIn: "pick one"},
		{args: []string{"node", "--id", "1", "--etcd", "x", "--data", "d", "--certs-dir", "/nonexistent"}, code: 2, stderrIn: "ca.crt"},
		{args: []string{"status"}, code: 2, stderrIn: "--etcd is required"},
		{args: []string{"verify", "--insecure"}, code: 2, stderrIn: "--etcd is required"},
		{args: []string{"verify", "--etcd", "x"}, code: 2, stderrIn: "--certs-dir is required to reach the nodes"},
		{args: []string{"node", "--id", "1", "--etcd", "x", "--data", "d", "--insecure", "--etcd-cert", "c"}, code: 2, stderrIn: "--etcd-cert and --etcd-key go together"},
		{args: []string{"node", "--id", "1", "--etcd", "https://x:2379", "--data", "d", "--insecure"}, code: 2, stderrIn: "needs a CA: --certs-dir (its ca.crt) or --etcd-cacert"},
		{args: []string{"node", "--id", "1", "--etcd", "x", "--data", "d", "--insecure", "--etcd-user", "u"}, code: 2, stderrIn: "--etcd-user and --etcd-password-file go together"},
		{args: []string{"status", "--etcd", "x", "--etcd-cacert", "/nonexistent"}, code: 2, stderrIn: "--etcd-cacert: open /nonexistent"},
		{args: []string{"verify", "extra"}, code: 2, stderrIn: `unexpected argument "extra"`},
		{args: []string{"demo", "extra"}, code: 2, stderrIn: `unexpected argument "extra"`},
		{args: []string{"demo", "--bogus"}, code: 2, stderrIn: "flag provided but not defined"},
		{args: []string{"chaos", "--faults", "kill,explode"}, code: 2, stderrIn: `unknown fault "explode"`},
		{args: []string{"chaos", "--duration", "0s"}, code: 2, stderrIn: "--duration 0s, want > 0"},
		{args: []string{"chaos", "--replicas", "1"}, code: 2, stderrIn: "--replicas 1, want 2..--nodes"},
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

// TestEveryCommandDescribed: each command listed says what it does under
// -h (and rejoin help NAME), not only its flags: status and verify said
// only their flags.
func TestEveryCommandDescribed(t *testing.T) {
	for _, c := range commands {
		var out, errOut bytes.Buffer
		if code := run([]string{"help", c.name}, &out, &errOut); code != 0 || !strings.HasPrefix(errOut.String(), "usage: rejoin "+c.name) {
			t.Errorf("rejoin help %s: exit %d, stderr begins %q", c.name, code, errOut.String()[:min(80, errOut.Len())])
		}
	}
}

// TestVersionCommit: the commit go build records from git (vcs.revision,
// which -buildvcs=false or go run leave out) is printed, shortened, with
// +modified for uncommitted changes and its time; without it the line
// says why there is none.
func TestVersionCommit(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/rejoin-db/rejoin", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{
			{Key: "-buildmode", Value: "exe"},
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "749cfa0c1b2a3d4e5f60718293a4b5c6d7e8f901"},
			{Key: "vcs.time", Value: "2026-11-28T01:00:00Z"},
			{Key: "vcs.modified", Value: "false"},
		}}
	platform := " " + runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		v    string
		bi   *debug.BuildInfo
		want string
	}{
		{"", bi, "rejoin v0.3.0 commit 749cfa0c1b2a (2026-11-28T01:00:00Z) go1.26.0" + platform},
		{"v9-linked", bi, "rejoin v9-linked commit 749cfa0c1b2a (2026-11-28T01:00:00Z) go1.26.0" + platform},
		{"", modifiedBuild(bi), "rejoin v0.3.0 commit 749cfa0c1b2a+modified (2026-11-28T01:00:00Z) go1.26.0" + platform},
		{"", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}, "rejoin (devel) commit unknown (built without VCS information: go run, -buildvcs=false, or in a git worktree; -ldflags \"-X main.commit=$(git rev-parse HEAD)\" names it) go1.26.0" + platform},
		{"", nil, "rejoin (unknown) commit unknown (built without VCS information: go run, -buildvcs=false, or in a git worktree; -ldflags \"-X main.commit=$(git rev-parse HEAD)\" names it) " + runtime.Version() + platform},
	} {
		if got := versionOf(tc.v, "", tc.bi); got != tc.want {
			t.Errorf("versionOf(%q, ...) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

// TestVersionLinkedCommit: a commit given at link time is printed where
// go recorded none (a build in a git worktree); go's own wins over it.
func TestVersionLinkedCommit(t *testing.T) {
	noVCS := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}
	if got := versionOf("", "e81a155c6ae5f00d", noVCS); !strings.HasPrefix(got, "rejoin (devel) commit e81a155c6ae5 go1.26.0") {
		t.Errorf("linked commit, no VCS information: %q", got)
	}
	withVCS := &debug.BuildInfo{GoVersion: "go1.26.0", Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "749cfa0c1b2a3d4e"}}}
	if got := versionOf("", "e81a155c6ae5f00d", withVCS); !strings.Contains(got, "commit 749cfa0c1b2a ") {
		t.Errorf("linked commit and go's: %q, want go's", got)
	}
}

// modifiedBuild is bi with uncommitted changes.
func modifiedBuild(bi *debug.BuildInfo) *debug.BuildInfo {
	m := *bi
	m.Settings = append([]debug.BuildSetting(nil), bi.Settings...)
	for i := range m.Settings {
		if m.Settings[i].Key == "vcs.modified" {
			m.Settings[i].Value = "true"
		}
	}
	return &m
}
