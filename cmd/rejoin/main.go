package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
)

// command is one subcommand: its name, a one-line summary, and the function
// that parses its own flags from args and runs it.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"demo", "start a local cluster, kill a node, watch it rejoin, check digests", runDemo},
	{"init", "create a cluster in an existing etcd: shape, tables, placement", runInit},
	{"node", "run one node of a cluster", runNode},
	{"replace", "move a dead node's replicas onto a new node, which rebuilds them by rejoins", runReplace},
	{"drain", "move every replica off a running node, one rejoin at a time, before removing it", runDrain},
	{"rebalance", "move replicas onto the running nodes that hold fewest, e.g. one just added", runRebalance},
	{"access", "give node and client certificates their etcd users (etcd's authentication)", runAccess},
	{"undo-move", "take back a move of drain or rebalance whose new replica is still being rebuilt", runUndoMove},
	{"accept-loss", "make a held replica live again, accepting the loss of what it missed", runAcceptLoss},
	{"put", "write a value under a key", runPut},
	{"get", "print the value under a key", runGet},
	{"del", "delete a key", runDel},
	{"load", "write rows at a rate, with a progress bar; print throughput and latency", runLoad},
	{"status", "show a cluster's nodes, replicas and rejoin tasks", runStatus},
	{"verify", "compare every replica's digest at a common txn ID", runVerify},
	{"cert", "create the cluster CA and node and client certificates", runCert},
	{"bench", "measure a rejoin: in-process, or --processes (2 nodes, every row, a fixed write rate); --redis: Redis's full resync beside it", runBench},
	{"sim", "run the seeded rejoin simulator; replay a failing seed", runSim},
	{"chaos", "randomized fault self-check of a local cluster: PASS or FAIL", runChaos},
	{"etcd", "run the embedded etcd as a process of its own (the walk-through's, the demo's, chaos's)", runEtcd},
	{"version", "print the version: module, commit, Go (also --version)", runVersion},
}

// helpSummary is usage's line for help, which run handles itself: it
// reads commands, which cannot hold it.
const helpSummary = "print the usage, or a command's: rejoin help COMMAND"

// errUsage marks an error whose message is already a usage text; main exits 2.
var errUsage = errors.New("usage")

// errSilent: the command already said why it failed; main exits 1.
var errSilent = errors.New("failed")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	if args[0] == "help" {
		if err := runHelp(args[1:], stdout, stderr); err != nil {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		case errors.Is(err, errSilent):
			return 1
		}
		fmt.Fprintf(stderr, "rejoin %s: %s\n", c.name, userMessage(c.name, err, nil))
		var ee *exitError
		if errors.As(err, &ee) {
			return ee.code
		}
		return 1
	}
	fmt.Fprintf(stderr, "rejoin: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: rejoin <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-10s %s\n", "help", helpSummary)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'rejoin help <command>' (or 'rejoin <command> -h') for what one command does and its flags.")
	fmt.Fprintln(w, "Shell completion: source <(rejoin completion bash), or zsh.")
	fmt.Fprint(w, exitStatuses)
}

// exitStatuses is usage's list of exit statuses (shell.go's constants).
const exitStatuses = `
exit status:
  0    done
  1    failed, or found wrong what it checks (verify: digests differ)
  2    usage error
  3    outcome unknown: a write was sent and no answer came, it may or may
       not have happened (verify: a partition could not be compared)
  4    no such key (get, del)
  5    no node registered (status)
  130  interrupted by Ctrl-C (drain and rebalance say what to run next)
`

// newFlagSet returns a flag set that reports errors instead of exiting, so
// run stays testable.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("rejoin "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if c, ok := stderr.(*flagSets); ok {
		c.sets = append(c.sets, fs)
	}
	return fs
}

// version, if set at link time (-ldflags "-X main.version=..."), names
// the build; else the module's version as go records it.
var version = ""

// commit, if set at link time (-ldflags "-X main.commit=$(git rev-parse
// HEAD)"), is the commit when go build records none: go (1.26 too) reads
// a git checkout's .git only as a directory, so a build in a git worktree,
// where .git is a file, has no VCS information even with -buildvcs=true.
var commit = ""

func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: rejoin version (or rejoin --version)")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Prints the module's version, the commit the binary was built from (+modified: with")
		fmt.Fprintln(stderr, "changes not committed), its time, and the Go version and platform it was built with.")
		fmt.Fprintln(stderr, "go build records the commit from a git checkout; not under go run or -buildvcs=false,")
		fmt.Fprintln(stderr, "nor in a git worktree (go reads .git only as a directory): there, build with")
		fmt.Fprintln(stderr, "  go build -ldflags \"-X main.commit=$(git rev-parse HEAD)\" ./cmd/rejoin")
	}
	if err := parseFlags(fs, "version", args, stderr); err != nil {
		return err
	}
	fmt.Fprintln(stdout, versionLine())
	return nil
}

// versionLine is the module's version, the commit it was built from (as
// go build records it from git: with "modified" for uncommitted changes)
// and the Go version: "rejoin (devel) commit 749cfa0c1b2a (2026-11-28T01:00:00Z) go1.26.0 linux/amd64".
func versionLine() string {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(version, commit, bi)
}

// versionOf is versionLine's text for a link-time version v and commit
// linked (either may be empty) and the build information go recorded
// (nil if none).
func versionOf(v, linked string, bi *debug.BuildInfo) string {
	commit, when, modified, goVersion := "", "", false, runtime.Version()
	if bi != nil {
		if v == "" {
			v = bi.Main.Version
		}
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(unknown)"
	}
	if commit == "" {
		commit = linked
	}
	line := "rejoin " + v
	switch {
	case commit == "":
		line += " commit unknown (built without VCS information: go run, -buildvcs=false, or in a git worktree; -ldflags \"-X main.commit=$(git rev-parse HEAD)\" names it)"
	default:
		line += " commit " + commit[:min(12, len(commit))]
		if modified {
			line += "+modified"
		}
		if when != "" {
			line += " (" + when + ")"
		}
	}
	return line + " " + goVersion + " " + runtime.GOOS + "/" + runtime.GOARCH
}

// runHelp prints the usage, or a command's own (its -h).
func runHelp(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return nil
	}
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run([]string{"-h"}, stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return err
		}
	}
	fmt.Fprintf(stderr, "rejoin help: unknown command %q\n\n", args[0])
	usage(stderr)
	return errUsage
}

// parseFlags parses a command's flags and refuses positional arguments.
// A bad flag is errUsage (the flag package already said why); -h is
// flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, name string, args []string, stderr io.Writer) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rejoin %s: unexpected argument %q\n", name, fs.Arg(0))
		return errUsage
	}
	return nil
}
