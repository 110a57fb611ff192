package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/rejoin-db/rejoin/recovery/supervise"
)

const acceptLossUsage = `usage: rejoin accept-loss --etcd ENDPOINTS [flags] PARTITION

Makes a held replica of PARTITION live again at its last txn, accepting
the loss of what it missed. A replica is held, not failed, when it may
lack txns its partition acknowledged (its node was cut off meanwhile) and
no other replica of the partition is live to rebuild it from: it keeps
its rows and answers nothing, and rejoin status shows it HELD with the
reason. If a replica that holds the missed txns comes back (a node that
was only cut off), the held one is rebuilt from it and loses nothing: wait
for that when it can come back. Otherwise this command is the way out:
the replica answers again, and the partition lacks the writes the reason
names. The loss is recorded in etcd, and rejoin status lists it (LOSSES).
Refused while a replica of the partition is live. With several held
replicas, --node names the one that goes live; the others are rebuilt
from it.

flags:
`

func runAcceptLoss(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("accept-loss", stderr)
	etcd := newEtcdFlags(fs)
	newClientCertsFlags(fs, etcd, etcdCertsDirUsage, supervise.AdminClient)
	node := fs.String("node", "", "the node whose held replica goes live (needed only when several are held)")
	wait := fs.Duration("wait", 10*time.Second, "how long to wait for the replica to be live (0: do not wait)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound of the write (the wait comes on top)")
	fs.Usage = func() {
		fmt.Fprint(stderr, acceptLossUsage)
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, "accept-loss", "one PARTITION argument", args, 1, stderr)
	if err != nil {
		return err
	}
	p, err := strconv.ParseUint(pos[0], 10, 32)
	if err != nil {
		fmt.Fprintf(stderr, "rejoin accept-loss: %q is not a partition number\n", pos[0])
		return errUsage
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "rejoin accept-loss: --timeout %s: want more than 0\n", *timeout)
		return errUsage
	}
	if *wait < 0 {
		fmt.Fprintf(stderr, "rejoin accept-loss: --wait %s: want 0 or more\n", *wait)
		return errUsage
	}
	if *node != "" {
		if *node, err = parseNodeID("node", *node); err != nil {
			fmt.Fprintf(stderr, "rejoin accept-loss: %v\n", err)
			return errUsage
		}
	}
	cli, ctx, done, err := openEtcd("accept-loss", etcd, *timeout+*wait, stderr)
	if err != nil {
		return err
	}
	defer done()
	loss, err := supervise.AcceptLoss(ctx, cli, uint32(p), *node, time.Now())
	if errors.Is(err, supervise.ErrNotHeld) {
		return err
	}
	if err != nil {
		return etcd.explain(etcdErr(ctx, etcd.endpoints, *timeout, err))
	}
	fmt.Fprintf(stdout, "accepted partition %d on %s: the loss of what it missed (%s) is recorded\n", loss.Partition, loss.Node, loss.Held)
	if *wait == 0 {
		return nil
	}
	deadline := time.Now().Add(*wait)
	for {
		live, err := supervise.ReplicaLive(ctx, cli, loss.Partition, loss.Node)
		if err == nil && live {
			fmt.Fprintf(stdout, "live     partition %d on %s\n", loss.Partition, loss.Node)
			return nil
		}
		if !time.Now().Before(deadline) {
			if err != nil {
				return etcd.explain(etcdErr(ctx, etcd.endpoints, *timeout, err))
			}
			return fmt.Errorf("partition %d on %s is not live %v after the loss was accepted: is %s running? It makes the replica live once it reads the record (rejoin status shows it)", loss.Partition, loss.Node, *wait, loss.Node)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return etcd.explain(etcdErr(ctx, etcd.endpoints, *timeout, ctx.Err()))
		}
	}
}
