package node

import (
	"context"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// StopMax bounds a node's stop from the moment it is asked to stop: the
// etcd calls its stop makes (attempts reporting their end, claims and
// the registration given up) each have a timeout of their own, and with
// etcd gone they would wait them out in turn. Past StopMax the node
// closes its etcd client, which fails every call still waiting at once,
// and says what it gave up: what etcd holds of it then ends with its
// leases, within their TTLs.
const StopMax = 3 * time.Second

// stopBound is the bound of one node's stop (StopMax).
type stopBound struct {
	log *slog.Logger
	cli *clientv3.Client

	mu       sync.Mutex
	deadline time.Time
	timer    *time.Timer
	// what is the step of the stop under way, named for the log.
	what   string
	gaveUp bool
}

func newStopBound(log *slog.Logger, cli *clientv3.Client) *stopBound {
	return &stopBound{log: log, cli: cli}
}

// begin starts the bound; before it, the node runs.
func (s *stopBound) begin() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		return
	}
	s.deadline = time.Now().Add(StopMax)
	s.what = "the node's admin HTTP and connections"
	s.timer = time.AfterFunc(StopMax, s.onTimeout)
}

// step names the step of the stop under way.
func (s *stopBound) step(what string) {
	s.mu.Lock()
	s.what = what
	s.mu.Unlock()
}

func (s *stopBound) onTimeout() {
	s.mu.Lock()
	s.gaveUp = true
	what := s.what
	s.mu.Unlock()
	s.log.Warn("node stopping: etcd did not answer within the stop's bound; closing the etcd client gives up what still waits on it (what etcd holds of this node ends with its leases)",
		"bound", StopMax, "gave_up", what)
	_ = s.cli.Close()
}

// deregister removes the node's record and revokes its lease, within
// what is left of the bound (the whole of it if the node stopped before
// its stop began, on a lost registration).
func (s *stopBound) deregister(reg *supervise.Node) {
	s.begin()
	s.step("deregistration: the node's record and lease expire by themselves within its TTL")
	s.mu.Lock()
	deadline := s.deadline
	s.mu.Unlock()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := reg.Close(ctx); err != nil {
		s.log.Info("node stopping: deregistration failed; the record and lease expire by themselves within the node's TTL", "err", err)
	}
}

// end stops the bound's timer.
func (s *stopBound) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
	}
}
