package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
	"github.com/rejoin-db/rejoin/recovery"
)

// TestWalkthrough runs README's "Run it as a database" section as written:
// every command of its sh blocks, in order, against processes of the
// test-built binary on loopback. What the README shows differs only in
// what must: etcd's port (a free one, not 2379), the directory (a
// temporary one, not /tmp/rejoin). etcd serves https and requires a
// client certificate of the cluster CA: every command reaches it with
// --certs-dir alone. A comment "# -> TEXT" is the
// command's expected stdout. Beyond the commands, the test checks what the
// prose promises: after the kill, status shows n3 gone; after the
// restart, every replica of n3 rejoins (its tasks done) and all are live
// before verify runs.
func TestWalkthrough(t *testing.T) {
	bin := rejoinBinary(t)
	lines := walkthroughLines(t)
	w := &walk{t: t, bin: bin, dir: t.TempDir(), vars: map[string]string{}, procs: map[string]*exec.Cmd{}, loads: map[string]*bgLoad{}, ids: map[string]string{}}
	defer checkNoNodes(t)
	defer w.stopAll()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w.ctx = ctx
	for _, l := range lines {
		t.Logf("$ %s", l)
		w.do(l)
		if t.Failed() {
			w.tailLogs()
			return
		}
	}
	if w.rejoiner == "" {
		t.Fatalf("the walk-through never restarted a node (phase %d)", w.phase)
	}
	if w.phase != phaseDrained || w.added == "" {
		t.Fatalf("the walk-through ends in phase %d, not with a node added (%q) and one drained (%q)", w.phase, w.added, w.drained)
	}
	if w.rejoiner == w.killed {
		t.Fatalf("the walk-through ends with %s restarted, not with a node replaced by another", w.killed)
	}
}

// walkthroughLines returns the lines of the sh blocks of README's
// walk-through section.
func walkthroughLines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Run it as a database\n")
	if !ok {
		t.Fatal("README has no section \"Run it as a database\"")
	}
	if i := strings.Index(sec, "\n## "); i >= 0 {
		sec = sec[:i]
	}
	var lines []string
	in := false
	for _, l := range strings.Split(sec, "\n") {
		switch {
		case l == "```sh":
			in = true
		case l == "```":
			in = false
		case in && strings.TrimSpace(l) != "":
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) < 15 {
		t.Fatalf("walk-through of %d lines", len(lines))
	}
	return lines
}

// Where the walk-through stands: what a status command must show.
const (
	phaseUp = iota
	phaseKilled
	phaseRestarted
	// phaseGrown: a node with a new id joined after the restart.
	phaseGrown
	// phaseDrained: a drain ran and its node was stopped.
	phaseDrained
)

type walk struct {
	t    *testing.T
	ctx  context.Context
	bin  string
	dir  string
	etcd string
	// certs is etcd's --certs-dir: the walk-through's etcd serves https
	// and wants a client certificate, which status's polls present too.
	certs string
	vars  map[string]string    // shell variables: N1=$! and the like
	procs map[string]*exec.Cmd // background processes by variable
	loads map[string]*bgLoad   // background loads by variable
	logs  []string
	phase int
	// ids are the node ids of the background nodes, by variable; killed
	// is the node the last kill stopped, rejoiner the node started after
	// it (the same one restarted, or the one that replaced it).
	ids              map[string]string
	killed, rejoiner string
	// added is the node that joined in phaseGrown, drained the one that
	// drain emptied.
	added, drained string
}

// readmeDir and readmeEtcd are what the README uses; the test runs its
// own.
const (
	readmeDir  = "/tmp/rejoin"
	readmeEtcd = "https://127.0.0.1:2379"
)

func (w *walk) do(line string) {
	t := w.t
	cmd, comment, _ := strings.Cut(line, "  #")
	cmd = strings.TrimSpace(cmd)
	want, hasWant := strings.CutPrefix(strings.TrimSpace(comment), "-> ")
	f := strings.Fields(cmd)
	switch {
	case cmd == "go build -o rejoin ./cmd/rejoin":
		return // built once for every test: rejoinBinary
	case len(f) == 3 && f[0] == "rm" && f[1] == "-rf":
		if !strings.HasPrefix(f[2], readmeDir) {
			t.Fatalf("%q: the walk-through removes only its own directory", cmd)
		}
		if err := os.RemoveAll(w.path(f[2])); err != nil {
			t.Fatal(err)
		}
		return
	case len(f) == 3 && f[0] == "mkdir" && f[1] == "-p":
		if err := os.MkdirAll(w.path(f[2]), 0o755); err != nil {
			t.Fatal(err)
		}
		return
	case len(f) == 2 && f[0] == "export" && strings.HasPrefix(f[1], "ETCD="):
		if v := strings.TrimPrefix(f[1], "ETCD="); v != readmeEtcd {
			t.Fatalf("ETCD=%s, the test substitutes %s", v, readmeEtcd)
		}
		return
	case len(f) == 3 && f[0] == "kill" && f[1] == "-9":
		w.kill(f[2])
		return
	case len(f) == 2 && f[0] == "wait":
		w.waitLoad(strings.TrimPrefix(f[1], "$"))
		return
	case len(f) < 2 || f[0] != "./rejoin":
		t.Fatalf("the test does not know how to run %q", cmd)
	}
	args, stderrFile, appendErr, bgVar := w.args(f[1:])
	switch f[1] {
	case "etcd":
		w.startEtcd(args)
		return
	case "node":
		if bgVar == "" {
			t.Fatalf("%q: a node runs in the background (& N=$!)", cmd)
		}
		w.startNode(bgVar, args, stderrFile, appendErr)
		return
	}
	if f[1] == "load" && bgVar != "" {
		w.startLoad(bgVar, args)
		return
	}
	if bgVar != "" || stderrFile != "" {
		t.Fatalf("%q: only etcd, nodes and load run in the background", cmd)
	}
	if f[1] == "status" {
		w.waitStatus()
	}
	if prefix, ok := strings.CutPrefix(strings.TrimSpace(comment), "Ctrl-C once it prints "); ok {
		w.interrupt(args, strings.Trim(prefix, `"`))
		return
	}
	out := w.run(args...)
	if f[1] == "drain" {
		w.phase, w.drained = phaseDrained, "n"+strings.TrimPrefix(args[len(args)-1], "n")
		if slices.Contains(args, "--stop") {
			w.stoppedByItself(w.drained)
		}
	}
	if hasWant && strings.TrimSpace(out) != want {
		t.Fatalf("%q printed %q, the README says %q", cmd, out, want)
	}
}

// path maps a README path into the test's directory.
func (w *walk) path(p string) string {
	if rest, ok := strings.CutPrefix(p, readmeDir); ok {
		return w.dir + rest
	}
	return p
}

// args substitutes the README's values and splits off redirections and a
// trailing "& VAR=$!".
func (w *walk) args(f []string) (args []string, stderrFile string, appendErr bool, bgVar string) {
	for i := 0; i < len(f); i++ {
		a := f[i]
		switch {
		case a == "&":
			if i+1 < len(f) {
				v, ok := strings.CutSuffix(f[i+1], "=$!")
				if !ok || i+2 != len(f) {
					w.t.Fatalf("after &: %q", f[i+1:])
				}
				bgVar = v
			} else {
				w.t.Fatal("& without VAR=$!")
			}
			return args, stderrFile, appendErr, bgVar
		case strings.HasPrefix(a, "2>>"):
			stderrFile, appendErr = w.path(a[3:]), true
			continue
		case strings.HasPrefix(a, "2>"):
			stderrFile = w.path(a[2:])
			continue
		case a == "$ETCD":
			if w.etcd == "" {
				w.t.Fatal("$ETCD before etcd runs")
			}
			a = w.etcd
		case a == "2379" && i > 0 && f[i-1] == "--port":
			a = "0"
		}
		args = append(args, w.path(a))
	}
	return args, stderrFile, appendErr, ""
}

// run runs a foreground command, bounded, and wants exit 0.
func (w *walk) run(args ...string) string {
	ctx, cancel := context.WithTimeout(w.ctx, time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	c := exec.CommandContext(ctx, w.bin, args...)
	c.Stdout, c.Stderr = &out, &errOut
	err := c.Run()
	w.t.Logf("%s%s", out.String(), errOut.String())
	if err != nil {
		w.t.Fatalf("rejoin %q: %v\nstdout %s\nstderr %s", args, err, out.String(), errOut.String())
	}
	return out.String()
}

// interrupt runs a foreground command until it prints a line starting
// with prefix, then sends it SIGINT, as Ctrl-C in a terminal would, and
// wants it to end at once saying what to run next.
func (w *walk) interrupt(args []string, prefix string) {
	var errOut bytes.Buffer
	c := exec.Command(w.bin, args...)
	c.Stderr = &errOut
	out, err := c.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		w.t.Fatal(err)
	}
	// The reader keeps stdout until the process closes it; Wait comes
	// after it is done, as os/exec asks.
	seen, eof := make(chan struct{}), make(chan struct{})
	var stdout bytes.Buffer
	go func() {
		defer close(eof)
		sc := bufio.NewScanner(out)
		found := false
		for sc.Scan() {
			stdout.WriteString(sc.Text() + "\n")
			if !found && strings.HasPrefix(sc.Text(), prefix) {
				found = true
				close(seen)
			}
		}
	}()
	stopped := func(d time.Duration) bool {
		select {
		case <-eof:
			return true
		case <-time.After(d):
			_ = c.Process.Kill()
			<-eof
			return false
		}
	}
	select {
	case <-seen:
	case <-eof:
	case <-time.After(time.Minute):
	}
	select {
	case <-seen:
	default:
		stopped(0)
		_ = c.Wait()
		w.t.Fatalf("rejoin %q printed no line starting %q within a minute\nstdout %s\nstderr %s", args, prefix, stdout.String(), errOut.String())
	}
	_ = c.Process.Signal(os.Interrupt)
	if !stopped(15 * time.Second) {
		_ = c.Wait()
		w.t.Fatalf("rejoin %q did not end within 15 s of SIGINT\nstdout %s\nstderr %s", args, stdout.String(), errOut.String())
	}
	err = c.Wait()
	w.t.Logf("%s%s(%v)", stdout.String(), errOut.String(), err)
	if code := c.ProcessState.ExitCode(); code != exitInterrupted || !strings.Contains(errOut.String(), "interrupted") || !strings.Contains(errOut.String(), "to go on") {
		w.t.Fatalf("rejoin %q, interrupted, exited %d saying %q: want %d, and what to run next", args, code, errOut.String(), exitInterrupted)
	}
}

// startLoad starts a background load; waitLoad wants it to end with exit
// status 0 (no write uncertain).
func (w *walk) startLoad(v string, args []string) {
	var out, errOut bytes.Buffer
	c := exec.Command(w.bin, args...)
	c.Stdout, c.Stderr = &out, &errOut
	if err := c.Start(); err != nil {
		w.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	w.loads[v] = &bgLoad{c: c, out: &out, errOut: &errOut, done: done}
}

type bgLoad struct {
	c           *exec.Cmd
	out, errOut *bytes.Buffer
	done        chan error
	// overlapped: the load was still running when the node it was to
	// outlive stopped.
	overlapped bool
}

func (w *walk) waitLoad(v string) {
	l := w.loads[v]
	if l == nil {
		w.t.Fatalf("wait $%s: no such load", v)
	}
	delete(w.loads, v)
	var err error
	select {
	case err = <-l.done:
	case <-time.After(2 * time.Minute):
		_ = l.c.Process.Kill()
		<-l.done
		w.t.Fatalf("the load did not end within 2 minutes\nstdout %s\nstderr %s", l.out.String(), l.errOut.String())
	}
	w.t.Logf("load: %s%s(%v)", l.out.String(), l.errOut.String(), err)
	if err != nil {
		w.t.Fatalf("the load across %s's stop: %v (exit 3: writes uncertain)\nstdout %s\nstderr %s", w.drained, err, l.out.String(), l.errOut.String())
	}
	if !l.overlapped {
		w.t.Fatalf("the load ended before %s stopped: it tested no stop", w.drained)
	}
}

// stoppedByItself wants node id's process, asked to stop by drain --stop,
// to have ended with exit status 0, and notes the loads that ran across
// it.
func (w *walk) stoppedByItself(id string) {
	for v, c := range w.procs {
		if w.ids[v] != id {
			continue
		}
		for _, l := range w.loads {
			select {
			case <-l.done:
				w.t.Fatalf("the load ended before %s stopped\nstdout %s\nstderr %s", id, l.out.String(), l.errOut.String())
			default:
				l.overlapped = true
			}
		}
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				w.t.Fatalf("%s, asked to stop by drain --stop, exited with %v", id, err)
			}
		case <-time.After(15 * time.Second):
			_ = c.Process.Kill()
			<-done
			w.t.Fatalf("%s did not exit within 15 s of drain --stop's return", id)
		}
		delete(w.procs, v)
		return
	}
	w.t.Fatalf("drain --stop %s: no such node process", id)
}

// start starts a background process and waits for its line starting with
// prefix on stdout.
func (w *walk) start(name string, args []string, stderr io.Writer, prefix string) (*exec.Cmd, string) {
	c := exec.Command(w.bin, args...)
	c.Stderr = stderr
	out, err := c.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		w.t.Fatal(err)
	}
	w.procs[name] = c
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), prefix) {
				lines <- sc.Text()
				break
			}
		}
		_, _ = io.Copy(io.Discard, out) // until the process ends
		close(lines)
	}()
	select {
	case l, ok := <-lines:
		if !ok {
			w.t.Fatalf("%s ended before %q", name, prefix)
		}
		return c, l
	case <-time.After(45 * time.Second):
		w.t.Fatalf("%s printed no %q within 45 s", name, prefix)
	}
	return nil, ""
}

func (w *walk) startEtcd(args []string) {
	for i, a := range args {
		if a == "--certs-dir" && i+1 < len(args) {
			w.certs = args[i+1]
		}
	}
	if w.certs == "" {
		w.t.Fatal("the walk-through's etcd runs without --certs-dir: it is to serve https and ask for client certificates")
	}
	_, l := w.start("etcd", args, &testWriter{t: w.t}, "ready etcd=")
	w.etcd = strings.TrimPrefix(l, "ready etcd=")
	if !strings.HasPrefix(w.etcd, "https://") {
		w.t.Fatalf("etcd serves %s, not https", w.etcd)
	}
}

func (w *walk) startNode(v string, args []string, stderrFile string, appendErr bool) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if appendErr {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(stderrFile, flags, 0o644)
	if err != nil {
		w.t.Fatal(err)
	}
	defer f.Close() // the process has its own copy
	w.logs = append(w.logs, stderrFile)
	c, l := w.start(v, args, f, "ready node=")
	w.vars[v] = strconv.Itoa(c.Process.Pid)
	w.t.Logf("%s (pid %d)", l, c.Process.Pid)
	for i, a := range args {
		if a == "--id" && i+1 < len(args) {
			w.ids[v] = "n" + args[i+1]
		}
	}
	switch w.phase {
	case phaseKilled:
		w.phase = phaseRestarted
		w.rejoiner = w.ids[v]
	case phaseRestarted:
		w.phase = phaseGrown
		w.added = w.ids[v]
	}
}

func (w *walk) kill(ref string) {
	v := strings.TrimPrefix(ref, "$")
	c := w.procs[v]
	if c == nil || w.vars[v] != strconv.Itoa(c.Process.Pid) {
		w.t.Fatalf("kill %s: no such process", ref)
	}
	if err := c.Process.Signal(syscall.SIGKILL); err != nil {
		w.t.Fatal(err)
	}
	_ = c.Wait()
	delete(w.procs, v)
	w.phase = phaseKilled
	w.killed = w.ids[v]
}

// waitStatus waits for what the README's prose says status shows at this
// point: every node up and every replica live at first; the killed node
// gone after a kill; after the node that follows it starts (the same
// restarted, or a new one that replaced it), that node's replicas
// rejoined (their tasks done) and every replica live.
func (w *walk) waitStatus() {
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		ok, why := w.statusShows()
		if ok {
			return
		}
		last = why
		time.Sleep(200 * time.Millisecond)
	}
	w.t.Fatalf("status never showed what the README says (phase %d): %s", w.phase, last)
}

func (w *walk) statusShows() (bool, string) {
	ctx, cancel := context.WithTimeout(w.ctx, 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, w.bin, "status", "--etcd", w.etcd, "--certs-dir", w.certs, "--json").Output()
	if err != nil {
		return false, err.Error()
	}
	var v clusterview.View
	if err := json.Unmarshal(out, &v); err != nil {
		return false, err.Error()
	}
	up := map[string]bool{}
	for _, n := range v.Nodes {
		up[n.ID] = true
	}
	nodes := 3
	if w.phase == phaseGrown {
		nodes = 4
	}
	allLive := func() (bool, string) {
		if len(up) != nodes || len(v.Replicas) != 32 || len(v.Moves) != 0 {
			return false, fmt.Sprintf("%d nodes, %d replicas, %d moves under way", len(up), len(v.Replicas), len(v.Moves))
		}
		for _, r := range v.Replicas {
			if r.Placement != recovery.ReplicaLive || !r.Alive || !r.Reported || r.State != recovery.ReplicaLive {
				return false, fmt.Sprintf("replica %d on %s: %+v", r.Partition, r.Node, r)
			}
		}
		return true, ""
	}
	switch w.phase {
	case phaseKilled:
		if up[w.killed] {
			return false, w.killed + " still registered"
		}
		return true, ""
	case phaseRestarted:
		hosted, done := 0, 0
		for _, r := range v.Replicas {
			if r.Node == w.rejoiner {
				hosted++
			}
			if r.Node == w.killed && w.killed != w.rejoiner {
				return false, fmt.Sprintf("%s, replaced, still holds a replica of partition %d", w.killed, r.Partition)
			}
		}
		for _, tk := range v.Tasks {
			if tk.Dest == w.rejoiner && tk.Status == "done" {
				done++
			}
		}
		if hosted == 0 || done != hosted {
			return false, fmt.Sprintf("%d of %s's %d replicas rejoined", done, w.rejoiner, hosted)
		}
	case phaseGrown, phaseDrained:
		// Rebalanced: each running node holds 32/nodes, within one. Drained:
		// the drained node holds nothing and is gone.
		count := map[string]int{}
		for _, r := range v.Replicas {
			count[r.Node]++
		}
		if w.phase == phaseDrained {
			if count[w.drained] > 0 || up[w.drained] {
				return false, fmt.Sprintf("%s, drained, holds %d replicas (registered: %v)", w.drained, count[w.drained], up[w.drained])
			}
			break
		}
		lo, hi := 32, 0
		for id := range up {
			lo, hi = min(lo, count[id]), max(hi, count[id])
		}
		if hi-lo > 1 || count[w.added] == 0 {
			return false, fmt.Sprintf("replicas per node %v: not within one, or none on %s", count, w.added)
		}
	}
	return allLive()
}

// stopAll stops every background process still running, as the README
// says: the nodes first (SIGTERM, all at once), then etcd, each waited
// for within a bound, then SIGKILLed.
func (w *walk) stopAll() {
	for _, l := range w.loads {
		_ = l.c.Process.Kill()
		<-l.done
	}
	var nodes []string
	for name := range w.procs {
		if name != "etcd" {
			nodes = append(nodes, name)
		}
	}
	w.stop(nodes...)
	w.stop("etcd")
}

func (w *walk) stop(names ...string) {
	done := map[string]chan struct{}{}
	for _, name := range names {
		c := w.procs[name]
		if c == nil {
			continue
		}
		_ = c.Process.Signal(syscall.SIGTERM)
		ch := make(chan struct{})
		go func() { _ = c.Wait(); close(ch) }()
		done[name] = ch
	}
	bound, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for name, ch := range done {
		select {
		case <-ch:
		case <-bound.Done():
			w.t.Errorf("%s did not stop on SIGTERM within 15 s", name)
			_ = w.procs[name].Process.Kill()
			<-ch
		}
		delete(w.procs, name)
	}
}

// tailLogs shows the end of each node's log on failure.
func (w *walk) tailLogs() {
	for _, f := range w.logs {
		b, _ := os.ReadFile(f)
		ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		w.t.Logf("--- end of %s ---\n%s", filepath.Base(f), strings.Join(ls[max(0, len(ls)-20):], "\n"))
	}
}
