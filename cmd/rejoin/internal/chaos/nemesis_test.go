package chaos

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
	"github.com/rejoin-db/rejoin/recovery"
)

func TestLastLive(t *testing.T) {
	live := func(p uint32, n string) clusterview.ReplicaRow {
		return clusterview.ReplicaRow{Partition: p, Node: n, Placement: recovery.ReplicaLive, Alive: true, Reported: true, State: recovery.ReplicaLive}
	}
	rejoining := func(p uint32, n string) clusterview.ReplicaRow {
		return clusterview.ReplicaRow{Partition: p, Node: n, Placement: recovery.ReplicaNeedsRejoin, Alive: true, Reported: true, State: recovery.ReplicaRejoining}
	}
	v := clusterview.View{Replicas: []clusterview.ReplicaRow{
		live(0, "n1"), live(0, "n2"), rejoining(0, "n3"), // n1 and n2 both live
		live(1, "n1"), rejoining(1, "n2"), live(1, "n3"), // n3 is down: n1 is the last live
		rejoining(2, "n2"), rejoining(2, "n3"), rejoining(2, "n4"), // nothing live: nothing to lose
	}}
	ns := &nemesis{n: 4, state: []nodeState{0, nodeUp, nodeUp, nodeDown, nodeUp}}
	for _, tt := range []struct {
		target string
		p      uint32
		ok     bool
	}{
		{"n1", 1, false},
		{"n2", 0, true},
		{"n4", 0, true},
	} {
		p, ok := ns.lastLiveLocked(v, tt.target)
		if ok != tt.ok || (!ok && p != tt.p) {
			t.Errorf("lastLiveLocked(%s) = %d, %v; want %d, %v", tt.target, p, ok, tt.p, tt.ok)
		}
	}
}

// TestLastLiveSettling: a replica whose node is settling a lost
// registration does not count as live: it may still fail for what it
// missed (rejoin chaos seed 1123: n1 killed while n2, just resumed from a
// stop past its lease, was settling; n2's replicas then failed and three
// partitions had no live replica left).
func TestLastLiveSettling(t *testing.T) {
	row := func(n string, settling bool) clusterview.ReplicaRow {
		return clusterview.ReplicaRow{Partition: 3, Node: n, Placement: recovery.ReplicaLive, Alive: true, Reported: true, State: recovery.ReplicaLive, Settling: settling}
	}
	ns := &nemesis{n: 2, state: []nodeState{0, nodeUp, nodeUp}}
	v := clusterview.View{Replicas: []clusterview.ReplicaRow{row("n1", false), row("n2", true)}}
	if p, ok := ns.lastLiveLocked(v, "n1"); ok || p != 3 {
		t.Errorf("lastLiveLocked(n1) with n2 settling = %d, %v; want 3, false", p, ok)
	}
	// The settling replica itself may hold the only copy (seed 1123 again:
	// n2, settling, was killed as if it held nothing, and five
	// partitions were lost).
	if _, ok := ns.lastLiveLocked(v, "n2"); !ok {
		t.Error("lastLiveLocked(n2), n2 settling and n1 live: refused")
	}
	v.Replicas[0].Settling, v.Replicas[1].Settling = true, true
	if p, ok := ns.lastLiveLocked(v, "n2"); ok || p != 3 {
		t.Errorf("lastLiveLocked(n2), both settling = %d, %v; want 3, false", p, ok)
	}
	v.Replicas[0].Settling, v.Replicas[1].Settling = false, false
	if _, ok := ns.lastLiveLocked(v, "n1"); !ok {
		t.Error("lastLiveLocked(n1) with n2 live: refused")
	}
}

// TestLastLiveUnknown: a target whose registration etcd lost (an etcd
// pause) or that did not answer may still hold a partition's only live
// copy: a kill would lose it (rejoin chaos seed 31337: n3, the last live
// replica of partitions 0, 4 and 5, was killed while etcd had lost its
// registration, and the three partitions were lost).
func TestLastLiveUnknown(t *testing.T) {
	ns := &nemesis{n: 2, state: []nodeState{0, nodeUp, nodeUp}}
	v := clusterview.View{Replicas: []clusterview.ReplicaRow{
		{Partition: 0, Node: "n1", Placement: recovery.ReplicaLive},
		{Partition: 0, Node: "n2", Placement: recovery.ReplicaNeedsRejoin, Alive: true, Reported: true, State: recovery.ReplicaNeedsRejoin},
	}}
	if p, ok := ns.lastLiveLocked(v, "n1"); ok || p != 0 {
		t.Errorf("lastLiveLocked(n1), n1 unregistered and n2 not live = %d, %v; want 0, false", p, ok)
	}
	v.Replicas[0].Alive = true // registered, no answer to /status
	if p, ok := ns.lastLiveLocked(v, "n1"); ok || p != 0 {
		t.Errorf("lastLiveLocked(n1), n1 not answering and n2 not live = %d, %v; want 0, false", p, ok)
	}
	v.Replicas[0].Reported, v.Replicas[0].State = true, recovery.ReplicaNeedsRejoin
	if _, ok := ns.lastLiveLocked(v, "n1"); !ok {
		t.Error("lastLiveLocked(n1), n1 reporting needs-rejoin: refused")
	}
}

// startsFailing are node processes whose first fails starts fail, as a
// node's does while it cannot reach etcd.
type startsFailing struct {
	mu     sync.Mutex
	fails  int
	starts int
}

func (p *startsFailing) Start(ctx context.Context, id int) (demo.ReadyLine, int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.starts++
	if p.starts <= p.fails {
		return demo.ReadyLine{}, 0, fmt.Errorf("n%d exited before it was ready (exit status 1)", id)
	}
	return demo.ReadyLine{Node: fmt.Sprintf("n%d", id), TCP: "127.0.0.1:1"}, 1000 + id, nil
}
func (p *startsFailing) Kill(int) error           { return nil }
func (p *startsFailing) Pause(int) error          { return nil }
func (p *startsFailing) Resume(int) error         { return nil }
func (p *startsFailing) Exited(int) (bool, error) { return false, nil }

// TestRestartTriedAgain: a restart that fails is tried again before the
// heal, as a service manager would; tried once, a node whose restart fell
// in an etcd cut stayed down for the rest of the run (rejoin chaos
// --duration 10m --seed 20261128: 8.5 minutes).
func TestRestartTriedAgain(t *testing.T) {
	p := &startsFailing{fails: 2}
	ns := &nemesis{ctx: context.Background(), nodes: p, n: 5, state: make([]nodeState, 6), healc: make(chan struct{}),
		killWin: map[int]int{}, logf: t.Logf}
	ns.state[5] = nodeDown
	ns.restart(ns.ctx, 5)
	deadline := time.Now().Add(10 * restartRetry)
	for {
		ns.mu.Lock()
		st := ns.state[5]
		ns.mu.Unlock()
		if st == nodeUp {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n5 not up %v after its first restart failed (state %v)", 10*restartRetry, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ns.abandon()
	if p.starts != 3 {
		t.Errorf("%d starts, want 3: two failed, one up", p.starts)
	}
}
