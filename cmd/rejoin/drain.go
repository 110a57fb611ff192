package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/supervise"
)

const drainUsage = `usage: rejoin drain --etcd ENDPOINTS [flags] NODE

Moves every replica off a running node before a planned removal, while
writes go on. Each move adds a replica of the partition on the running
node with the fewest replicas that holds none of it; that node rebuilds
it by a rejoin (the same claims, fencing and supervision as a restart;
the drained node may be its source); once it is live, the drained node's
replica is removed in one etcd transaction that checks it, and the
drained node drops it. No partition ever has fewer live replicas than
before its move. When drain returns, stop the node.

An interrupted drain goes on where it stopped when run again.

NODE is a node id: n3 or 3.

flags:
`

// moveFlags are the flags drain and rebalance share.
type moveFlags struct {
	etcd     *etcdFlags
	inFlight *int
	incoming *int
	timeout  *time.Duration
	every    *time.Duration
}

func newMoveFlags(fs *flag.FlagSet) *moveFlags {
	etcd := newEtcdFlags(fs)
	newClientCertsFlags(fs, etcd, etcdCertsDirUsage)
	return &moveFlags{
		etcd:     etcd,
		inFlight: fs.Int("moves-max", supervise.MoveInFlightMaxDefault, "moves under way at once (1: one partition at a time)"),
		incoming: fs.Int("incoming-max", supervise.MoveIncomingMaxDefault, "moves under way onto one node at once"),
		timeout:  fs.Duration("timeout", 30*time.Minute, "bound of the whole command"),
		every:    fs.Duration("poll", 250*time.Millisecond, "how often the moves are looked at"),
	}
}

func (f *moveFlags) check() error {
	switch {
	case *f.inFlight < 1:
		return fmt.Errorf("--moves-max %d: want 1 or more", *f.inFlight)
	case *f.incoming < 1:
		return fmt.Errorf("--incoming-max %d: want 1 or more", *f.incoming)
	case *f.timeout <= 0:
		return fmt.Errorf("--timeout %s: want more than 0", *f.timeout)
	case *f.every <= 0:
		return fmt.Errorf("--poll %s: want more than 0", *f.every)
	}
	return nil
}

func (f *moveFlags) limits() supervise.MoveLimits {
	return supervise.MoveLimits{InFlightMax: *f.inFlight, IncomingMax: *f.incoming}
}

// parseOneNode parses the flags and the one NODE argument after them.
func parseOneNode(fs *flag.FlagSet, name string, args []string, stderr io.Writer) (string, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return "", err
		}
		return "", errUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "rejoin %s: want one NODE argument after the flags, got %d\n", name, fs.NArg())
		return "", errUsage
	}
	id, err := parseNodeID("node", fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "rejoin %s: %v\n", name, err)
		return "", errUsage
	}
	return id, nil
}

func runDrain(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("drain", stderr)
	mf := newMoveFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, drainUsage)
		fs.PrintDefaults()
	}
	id, err := parseOneNode(fs, "drain", args, stderr)
	if err != nil {
		return err
	}
	if err := mf.check(); err != nil {
		fmt.Fprintf(stderr, "rejoin drain: %v\n", err)
		return errUsage
	}
	lim := mf.limits()
	return runMoves("drain", mf, stdout, stderr, func(s supervise.MoveState) ([]supervise.Move, bool, error) {
		return supervise.PlanDrain(s, id, lim)
	}, fmt.Sprintf("%s holds no replica: stop it", id))
}

// runMoves runs move passes of plan until it says done, printing each
// move as it starts and ends.
func runMoves(name string, mf *moveFlags, stdout, stderr io.Writer, plan supervise.Planner, doneMsg string) error {
	cli, ctx, done, err := openEtcd(name, mf.etcd, *mf.timeout, stderr)
	if err != nil {
		return err
	}
	defer done()
	started, finished, err := movePasses(ctx, cli, plan, *mf.every, stdout)
	if err != nil {
		if errors.Is(err, supervise.ErrMove) || errors.Is(err, supervise.ErrConfig) {
			return fmt.Errorf("%w (moves started %d, finished %d; run it again to go on)", err, started, finished)
		}
		return mf.etcd.explain(etcdErr(ctx, mf.etcd.endpoints, *mf.timeout, err))
	}
	fmt.Fprintf(stdout, "done: %d moves; %s\n", finished, doneMsg)
	return nil
}

// movePasses runs supervise.MovePass every every until plan is done or
// ctx ends.
func movePasses(ctx context.Context, cli *clientv3.Client, plan supervise.Planner, every time.Duration, stdout io.Writer) (started, finished int, err error) {
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		evs, done, err := supervise.MovePass(pctx, cli, plan, time.Now())
		cancel()
		for _, ev := range evs {
			if ev.Cancelled {
				fmt.Fprintf(stdout, "dropped  %s: %s's replica record is gone (replaced?); planned again\n", ev.Move, ev.Move.To)
				continue
			}
			if ev.Finished {
				finished++
				fmt.Fprintf(stdout, "moved    %s: the replica on %s is live; %s's removed\n", ev.Move, ev.Move.To, ev.Move.From)
			} else {
				started++
				fmt.Fprintf(stdout, "moving   %s: %s rebuilds it by a rejoin\n", ev.Move, ev.Move.To)
			}
		}
		if err != nil || done {
			return started, finished, err
		}
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return started, finished, ctx.Err()
		}
	}
}
