package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Limits of the node processes.
const (
	readyTimeout = 60 * time.Second // from exec to the ready line
	stopGrace    = 3 * time.Second  // SIGTERM to SIGKILL at the end
)

// ReadyLine is what `rejoin node` prints on stdout once registered.
type ReadyLine struct{ Node, TCP, HTTP string }

// ParseReadyLine parses "ready node=n1 tcp=ADDR http=ADDR".
func ParseReadyLine(line string) (ReadyLine, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "ready" {
		return ReadyLine{}, false
	}
	var r ReadyLine
	for _, kv := range f[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return ReadyLine{}, false
		}
		switch k {
		case "node":
			r.Node = v
		case "tcp":
			r.TCP = v
		case "http":
			r.HTTP = v
		}
	}
	return r, r.Node != "" && r.TCP != "" && r.HTTP != ""
}

// proc is one node process, one incarnation.
type proc struct {
	id    int
	cmd   *exec.Cmd
	ready ReadyLine
	done  chan struct{} // closed once Wait returned
	err   error         // Wait's, valid after done
	log   *os.File
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// alive reports whether the process has not exited.
func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// procs runs the cluster's node processes: every one it started is ours,
// killed by its pid only, and waited for.
type procs struct {
	binary string
	etcd   string
	dir    string
	extra  func(id int) []string // more flags per node
	// env, if set, is added to the nodes' environment (chaos's planted
	// fault).
	env []string
	// user, if set, gives the uid and gid node id runs as (chaos's
	// network faults tell the nodes' packets apart by their owner).
	user func(id int) (uid, gid uint32)

	mu  sync.Mutex
	cur map[int]*proc // the current incarnation of each node
	all []*proc       // every incarnation started
}

func newProcs(binary, etcd, dir string, extra func(int) []string) *procs {
	return &procs{binary: binary, etcd: etcd, dir: dir, extra: extra, cur: map[int]*proc{}}
}

// start execs node id and waits for its ready line (or its exit).
func (ps *procs) start(ctx context.Context, id int) (*proc, error) {
	name := fmt.Sprintf("n%d", id)
	logPath := filepath.Join(ps.dir, name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(lf, "=== rejoin demo: starting %s at %s\n", name, time.Now().Format(time.RFC3339Nano))
	args := []string{"node", "--id", strconv.Itoa(id), "--etcd", ps.etcd,
		"--data", filepath.Join(ps.dir, name), "--log-format", "text"}
	if ps.extra != nil {
		args = append(args, ps.extra(id)...)
	}
	// Not CommandContext: the end of ctx must not kill a node behind our
	// back; stopAll does it, and waits.
	cmd := exec.Command(ps.binary, args...)
	cmd.Stderr = lf
	cmd.SysProcAttr = sysProcAttr()
	if ps.user != nil {
		uid, gid := ps.user(id)
		cmd.SysProcAttr = setCredential(cmd.SysProcAttr, uid, gid)
	}
	if ps.env != nil {
		cmd.Env = append(os.Environ(), ps.env...)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		lf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{id: id, cmd: cmd, done: make(chan struct{}), log: lf}
	ps.mu.Lock()
	ps.cur[id] = p
	ps.all = append(ps.all, p)
	ps.mu.Unlock()

	readyc := make(chan ReadyLine, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stdout)
		seen := false
		for sc.Scan() {
			line := sc.Text()
			if r, ok := ParseReadyLine(line); ok && !seen {
				seen = true
				readyc <- r
				continue
			}
			fmt.Fprintf(lf, "stdout: %s\n", line)
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		<-scanned // Wait closes the pipe: read it all first
		p.err = cmd.Wait()
		lf.Close()
		close(p.done)
	}()

	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case r := <-readyc:
		if r.Node != name {
			ps.kill(p)
			return nil, fmt.Errorf("%s announced itself as %s", name, r.Node)
		}
		p.ready = r
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before it was ready (%v); see %s", name, p.err, logPath)
	case <-timer.C:
		ps.kill(p)
		return nil, fmt.Errorf("%s not ready after %s; see %s", name, readyTimeout, logPath)
	case <-ctx.Done():
		ps.kill(p)
		return nil, ctx.Err()
	}
}

// get returns the current incarnation of node id, nil if none.
func (ps *procs) get(id int) *proc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.cur[id]
}

// kill SIGKILLs p (by its pid: our own child) and waits for it.
func (ps *procs) kill(p *proc) {
	if p.alive() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// killNode SIGKILLs the current incarnation of node id.
func (ps *procs) killNode(id int) error {
	p := ps.get(id)
	if p == nil {
		return fmt.Errorf("n%d is not running", id)
	}
	if !p.alive() {
		return fmt.Errorf("n%d already exited: %v", id, p.err)
	}
	ps.kill(p)
	return nil
}

// stopAll stops every process still running: SIGTERM, then SIGKILL after
// grace (0: at once), and waits for each.
func (ps *procs) stopAll(grace time.Duration) {
	ps.mu.Lock()
	all := append([]*proc(nil), ps.all...)
	ps.mu.Unlock()
	if grace > 0 {
		for _, p := range all {
			if p.alive() {
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
			}
		}
		deadline := time.NewTimer(grace)
		defer deadline.Stop()
	wait:
		for _, p := range all {
			select {
			case <-p.done:
			case <-deadline.C:
				break wait
			}
		}
	}
	for _, p := range all {
		ps.kill(p)
	}
}

// exited lists the current incarnations that died on their own, as an
// error that halts a Poll.
func (ps *procs) exited() error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var errs []error
	for id, p := range ps.cur {
		if !p.alive() {
			errs = append(errs, fmt.Errorf("n%d exited: %v", id, p.err))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return Halt(errors.Join(errs...))
}
