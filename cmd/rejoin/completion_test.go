package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// completionScript is `rejoin completion SHELL`'s output.
func completionScript(t *testing.T, shell string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run([]string{"completion", shell}, &out, &errOut); code != 0 {
		t.Fatalf("rejoin completion %s: exit %d, stderr %q", shell, code, errOut.String())
	}
	return out.String()
}

// helpFlags are the flags `rejoin help NAME` lists: read from the help
// text, not from the flag sets completion reads, so that a command whose
// flags completion cannot see fails here.
func helpFlags(t *testing.T, name string) []string {
	t.Helper()
	var out, errOut bytes.Buffer
	run([]string{"help", name}, &out, &errOut)
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)`).FindAllStringSubmatch(errOut.String(), -1) {
		flags = append(flags, m[1])
	}
	return flags
}

// caseArm is the text of a shell script's case arm for command name, up
// to the next arm ("    name)" at the start of a line, ended by ";;").
func caseArm(script, name string) string {
	i := strings.Index(script, "\n    "+name+")\n")
	if i < 0 {
		return ""
	}
	arm := script[i+1:]
	if j := strings.Index(arm, ";;"); j >= 0 {
		arm = arm[:j]
	}
	return arm
}

// TestCompletionNamesEveryCommand: the bash and zsh scripts name every
// command of the table and help, and in each command's arm every flag its
// help lists: a command added to the table, or a flag to a command, is in
// the scripts or this fails.
func TestCompletionNamesEveryCommand(t *testing.T) {
	names := []string{"help"}
	for _, c := range commands {
		names = append(names, c.name)
	}
	if !strings.Contains(strings.Join(names, " "), "completion") {
		t.Fatal("the command table has no completion command")
	}
	for _, shell := range []string{"bash", "zsh"} {
		script := completionScript(t, shell)
		for _, name := range names {
			arm := caseArm(script, name)
			if arm == "" {
				t.Errorf("%s: no case arm for command %s", shell, name)
				continue
			}
			for _, f := range helpFlags(t, name) {
				if !regexp.MustCompile(`(^|[ "'])--` + regexp.QuoteMeta(f) + `[ "'\[]`).MatchString(arm) {
					t.Errorf("%s: command %s's arm lacks --%s", shell, name, f)
				}
			}
		}
		if shell == "bash" {
			first := regexp.MustCompile(`compgen -W "([^"]*)"`).FindStringSubmatch(script)
			if first == nil {
				t.Fatal("bash: no command word list")
			}
			words := " " + first[1] + " "
			for _, name := range names {
				if !strings.Contains(words, " "+name+" ") {
					t.Errorf("bash: the first word's list %q lacks %s", first[1], name)
				}
			}
		} else {
			for _, name := range names {
				if !strings.Contains(script, "\n        '"+name+":") {
					t.Errorf("zsh: the commands' list lacks %s", name)
				}
			}
		}
	}
	if len(helpFlags(t, "node")) < 10 || len(helpFlags(t, "put")) < 5 {
		t.Fatalf("help lists %d flags of node and %d of put: the help parsing is broken", len(helpFlags(t, "node")), len(helpFlags(t, "put")))
	}
}

// TestCompletionBash: the bash script is valid bash, and once sourced it
// completes commands, a command's flags, help's and completion's
// arguments, and file names after a file flag.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		// Without bash the names are still checked above; nothing to run.
		t.Log("no bash on PATH: the script is not run")
		return
	}
	script := filepath.Join(t.TempDir(), "rejoin.bash")
	if err := os.WriteFile(script, []byte(completionScript(t, "bash")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bash, "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v: %s", err, out)
	}
	complete := func(words ...string) string {
		t.Helper()
		prog := `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _rejoin; echo "${COMPREPLY[*]}"`
		out, err := exec.Command(bash, append([]string{"-c", prog, "bash", script}, words...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("completing %q: %v: %s", words, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"rejoin", "dr"}, "drain"},
		{[]string{"rejoin", "undo"}, "undo-move"},
		{[]string{"rejoin", "drain", "--st"}, "--stall --stop"},
		{[]string{"rejoin", "put", "--value-f"}, "--value-file"},
		{[]string{"rejoin", "node", "--data", ""}, ""},
		{[]string{"rejoin", "help", "ver"}, "verify version"},
		{[]string{"rejoin", "completion", ""}, "bash zsh"},
		{[]string{"rejoin", "nope", "--"}, ""},
	} {
		if got := complete(tc.words...); got != tc.want {
			t.Errorf("completing %q: %q, want %q", tc.words, got, tc.want)
		}
	}
}

// TestCompletionUsage: a shell other than bash or zsh, or none, is a
// usage error; -h says how to load the script.
func TestCompletionUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"completion", "fish"}, 2, `unknown shell "fish": want bash or zsh`},
		{[]string{"completion"}, 2, "usage: rejoin completion bash|zsh"},
		{[]string{"help", "completion"}, 0, "source <(rejoin completion bash)"},
		{[]string{"--help"}, 0, "completion"},
	} {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("rejoin %q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}
