package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/wire"
)

// destinationDriver is the thin driver of the rejoining replica's core
// (recovery.Replica). It starts a destination attempt on it (an empty
// replica), joins the initiator's feed, and feeds the core the feed, the
// source's frames and ticks. Once live the core executes the buffered
// txns and the feed.
type destinationDriver struct {
	replica
	cfg       recovery.DestinationConfig
	execCfg   partition.ExecutorConfig
	initiator chan<- chan<- *batch // where to join the feed
	feedIn    chan *batch          // the feed, once joined
	proc      *recovery.Destination

	// Written before live is closed, read by Run after: when the replica
	// went live, the processor's metrics then, how many txns it had
	// buffered that it must now execute, and its rows.
	liveAt  time.Time
	metrics recovery.Metrics
	backlog int
	rows    int
	live    chan struct{}
	// onLive, if set, runs on the replica when it goes live: a test's way
	// to make the replicas differ and see the final comparison fail.
	onLive func(*partition.Partition)
}

// run builds the replica on this goroutine, which owns it from now on,
// joins the feed and loops.
func (d *destinationDriver) run(ctx context.Context) error {
	core, err := recovery.NewReplica(recovery.ReplicaConfig{Partition: d.cfg.Header.Partition, DropResults: true,
		NewExecutor: func() (*partition.Executor, error) {
			p := partition.New()
			if _, err := p.CreateTable(kvSchema()); err != nil {
				return nil, err
			}
			d.exec = partition.NewExecutor(p, partition.NewBuiltinRegistry(), d.execCfg)
			return d.exec, nil
		}})
	if err != nil {
		return fmt.Errorf("bench: destination: %w", err)
	}
	for _, in := range d.cfg.Initiators {
		core.AddInitiator(in)
	}
	if err := core.StartDestination("source", d.cfg); err != nil {
		return fmt.Errorf("bench: destination: %w", err)
	}
	d.core, d.proc = core, core.Destination()
	select {
	case d.initiator <- d.feedIn:
	case <-ctx.Done():
		return nil
	}
	return d.loop(ctx, d)
}

func (d *destinationDriver) onBatch(b *batch) error {
	for _, inv := range b.txns {
		if !d.core.OnTxn(inv) {
			return d.refused(inv.ID)
		}
	}
	if b.heartbeat != 0 && !d.core.OnHeartbeat(b.heartbeat) {
		return d.refused(b.heartbeat)
	}
	if b.end {
		if d.proc.State() != recovery.StateLive {
			return fmt.Errorf("bench: destination: the feed ended in state %s", d.proc.State())
		}
		d.takeEnd(b)
	}
	return d.check()
}

func (d *destinationDriver) onMessage(m wire.Message) error {
	if err := d.core.OnDestinationMessage(d.cfg.Header.Epoch, m); err != nil {
		if cerr := d.check(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("bench: destination: %v: %w", m.Type(), err)
	}
	return d.check()
}

func (d *destinationDriver) onTick() error {
	d.core.Tick()
	return d.check()
}

func (d *destinationDriver) control() <-chan struct{} { return nil }
func (d *destinationDriver) onControl() error         { return nil }

func (d *destinationDriver) work() (bool, error) {
	if d.proc.State() != recovery.StateLive {
		return false, nil
	}
	return d.step(nil)
}

func (d *destinationDriver) outbox() []wire.Message { return d.messages() }
func (d *destinationDriver) linkOpen() bool         { return true }
func (d *destinationDriver) finished() (bool, error) {
	return d.maybeFinish()
}

// check looks at the processor's state after a call: the moment it goes
// live, and an abort.
func (d *destinationDriver) check() error {
	switch d.proc.State() {
	case recovery.StateLive:
		if d.liveAt.IsZero() {
			d.liveAt = time.Now()
			d.metrics = d.proc.Metrics()
			d.backlog = d.exec.Queued()
			for _, t := range d.exec.Partition().Tables() {
				d.rows += t.Len()
			}
			if d.onLive != nil {
				d.onLive(d.exec.Partition())
			}
			close(d.live)
		}
	case recovery.StateAborted:
		return fmt.Errorf("bench: destination: %w", d.proc.Err())
	}
	return nil
}
