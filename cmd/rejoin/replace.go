package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
)

const replaceUsage = `usage: rejoin replace --etcd ENDPOINTS --dead NODE --with NODE [--wait D]

Re-places every replica of a node that died for good onto another node
that is not running: a new node id (give it a certificate with 'rejoin
cert create-node N'), or a node that is stopped. Start that node after
it ('rejoin node --id N'): each replica it was given is rebuilt by a
rejoin from a live replica of its partition, with the same claims,
fencing and supervision as a restart, while writes go on.

A node just killed stays registered until its lease ends (the node TTL,
4 s by default): replace waits up to --wait for that. It refuses a node
that is running, and a --with node that already hosts a replica of one of
the dead node's partitions. Each partition moves in one etcd transaction,
so an interrupted replace is finished by running it again.

NODE is a node id: n4 or 4 (the N of 'rejoin node --id N').

flags:
`

// parseNodeID reads one node id: nN or N.
func parseNodeID(flagName, s string) (string, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(s), "n"))
	if err != nil || n < 1 || n >= int(txnid.InitiatorsMax) {
		return "", fmt.Errorf("--%s %q is not a node id (n1..n%d, the N of rejoin node --id N)", flagName, s, txnid.InitiatorsMax-1)
	}
	return node.NodeName(n), nil
}

func runReplace(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("replace", stderr)
	etcd := newEtcdFlags(fs)
	newClientCertsFlags(fs, etcd, etcdCertsDirUsage, supervise.AdminClient)
	deadFlag := fs.String("dead", "", "the `node` that died for good")
	withFlag := fs.String("with", "", "the `node` that takes its replicas; not running")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the dead node's lease to end")
	timeout := fs.Duration("timeout", 30*time.Second, "bound of the moves, after the wait")
	fs.Usage = func() {
		fmt.Fprint(stderr, replaceUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, "replace", args, stderr); err != nil {
		return err
	}
	dead, err := parseNodeID("dead", *deadFlag)
	var with string
	if err == nil {
		with, err = parseNodeID("with", *withFlag)
	}
	if err == nil && dead == with {
		err = fmt.Errorf("--dead and --with are both %s", dead)
	}
	if err == nil && *wait < 0 {
		err = fmt.Errorf("--wait %s: want 0 or more", *wait)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rejoin replace: %s\n", userMessage("replace", err, nil))
		return errUsage
	}
	cli, ctx, done, err := openEtcd("replace", etcd, *wait+*timeout, stderr)
	if err != nil {
		return err
	}
	defer done()
	if err := waitUnregistered(ctx, cli, dead, *wait, stdout); err != nil {
		return etcd.explain(etcdErr(ctx, etcd.endpoints, *wait+*timeout, err))
	}
	// The new node's etcd user, so that it may register: under etcd's
	// authentication a node's certificate has no other way in.
	on, err := supervise.AuthEnabled(ctx, cli)
	if err == nil && on {
		err = supervise.SetupAccess(ctx, cli, supervise.Access{Nodes: []string{with}})
	}
	if err != nil {
		return etcd.explain(etcdErr(ctx, etcd.endpoints, *wait+*timeout, err))
	}
	moved, err := supervise.Replace(ctx, cli, dead, with)
	if len(moved) > 0 {
		fmt.Fprintf(stdout, "moved %d replicas of %s to %s: partitions %s\n", len(moved), dead, with, partitionList(moved))
	}
	if err != nil {
		if errors.Is(err, supervise.ErrPlacement) || errors.Is(err, supervise.ErrRunning) {
			return fmt.Errorf("nothing more moved: %w", err)
		}
		return etcd.explain(etcdErr(ctx, etcd.endpoints, *wait+*timeout, err))
	}
	fmt.Fprintf(stdout, "start %s: rejoin node --id %s --etcd %s --data DIR --certs-dir CERTS; each of its replicas rejoins from a live one\n",
		with, strings.TrimPrefix(with, "n"), etcd.endpoints)
	return nil
}

// waitUnregistered waits, up to wait, for node's registration to end.
func waitUnregistered(ctx context.Context, cli *clientv3.Client, id string, wait time.Duration, stdout io.Writer) error {
	deadline := time.Now().Add(wait)
	told := false
	for {
		nodes, err := supervise.Nodes(ctx, cli)
		if err != nil {
			return err
		}
		up := false
		for _, n := range nodes {
			up = up || n.ID == id
		}
		if !up {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w: %s is still registered after %s (--wait): it is running, or its lease has not ended", supervise.ErrRunning, id, wait)
		}
		if !told {
			fmt.Fprintf(stdout, "waiting up to %s for %s's lease to end\n", wait, id)
			told = true
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// partitionList prints ps compactly: 0-3,7,9-10.
func partitionList(ps []uint32) string {
	var out []string
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if j == i {
			out = append(out, strconv.FormatUint(uint64(ps[i]), 10))
		} else {
			out = append(out, fmt.Sprintf("%d-%d", ps[i], ps[j]))
		}
		i = j + 1
	}
	return strings.Join(out, ",")
}
