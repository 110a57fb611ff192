package demo

import (
	"context"
	"fmt"
	"time"
)

// What `rejoin chaos` (internal/chaos) reuses of the demo: etcd as a
// process of its own and the node processes, each started, signalled and
// killed by its pid only.

// StopGrace is the SIGTERM-to-SIGKILL grace of the processes at the end.
const StopGrace = stopGrace

// Etcd is etcd run as a process of its own (`rejoin etcd`).
type Etcd struct{ p *etcdProc }

// StartEtcd execs `binary etcd` with its data and log in dir and waits
// for it to serve; with certsDir (EnsureCerts's) over TLS, client
// certificates required.
func StartEtcd(ctx context.Context, binary, dir, certsDir string) (*Etcd, error) {
	p, err := startEtcdProc(ctx, binary, dir, certsDir)
	if err != nil {
		return nil, err
	}
	return &Etcd{p: p}, nil
}

// Endpoint is etcd's client URL.
func (e *Etcd) Endpoint() string { return e.p.endpoint }

// Pid is etcd's process id.
func (e *Etcd) Pid() int { return e.p.pid() }

// Pause stops etcd (SIGSTOP); Resume lets it run again (SIGCONT).
func (e *Etcd) Pause() error  { return e.p.pause() }
func (e *Etcd) Resume() error { return e.p.resume() }

// Stop ends etcd: SIGTERM, SIGKILL after grace; it waits for the exit.
func (e *Etcd) Stop(grace time.Duration) { e.p.stop(grace) }

// Nodes runs a cluster's node processes (`rejoin node`), one current
// incarnation per node id.
type Nodes struct{ ps *procs }

// NewNodes runs nodes of binary against etcd, their data and logs in dir
// (dir/nN, dir/nN.log); extra gives each node's further flags, env is
// added to their environment.
func NewNodes(binary, etcd, dir string, extra func(id int) []string, env []string) *Nodes {
	ps := newProcs(binary, etcd, dir, extra)
	ps.env = env
	return &Nodes{ps: ps}
}

// RunAs makes every node started from now on run as the uid and gid
// user gives it; the caller makes its data directory and credentials
// theirs.
func (n *Nodes) RunAs(user func(id int) (uid, gid uint32)) { n.ps.user = user }

// Start execs node id and waits for its ready line; it returns its pid.
func (n *Nodes) Start(ctx context.Context, id int) (ReadyLine, int, error) {
	p, err := n.ps.start(ctx, id)
	if err != nil {
		return ReadyLine{}, 0, err
	}
	return p.ready, p.pid(), nil
}

// Kill SIGKILLs the current incarnation of node id and waits for it.
func (n *Nodes) Kill(id int) error { return n.ps.killNode(id) }

// Pause stops node id (SIGSTOP); Resume lets it run again (SIGCONT).
func (n *Nodes) Pause(id int) error {
	p, err := n.running(id)
	if err != nil {
		return err
	}
	return pauseProcess(p.cmd.Process)
}

func (n *Nodes) Resume(id int) error {
	p, err := n.running(id)
	if err != nil {
		return err
	}
	return resumeProcess(p.cmd.Process)
}

func (n *Nodes) running(id int) (*proc, error) {
	p := n.ps.get(id)
	if p == nil {
		return nil, fmt.Errorf("n%d is not running", id)
	}
	if !p.alive() {
		return nil, fmt.Errorf("n%d exited: %v", id, p.err)
	}
	return p, nil
}

// Exited reports whether the current incarnation of node id has exited,
// and how (Wait's error); false if it runs or never started.
func (n *Nodes) Exited(id int) (bool, error) {
	p := n.ps.get(id)
	if p == nil || p.alive() {
		return false, nil
	}
	return true, p.err
}

// StopAll stops every process started: SIGTERM, SIGKILL after grace.
func (n *Nodes) StopAll(grace time.Duration) { n.ps.stopAll(grace) }
