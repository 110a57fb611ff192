package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/rejoin-db/rejoin/recovery/supervise"
)

const undoMoveUsage = `usage: rejoin undo-move --etcd ENDPOINTS [flags] PARTITION

Takes back a move that drain or rebalance started and that has not ended:
the new holder's replica, still being rebuilt, is removed with the move
and its rejoin task, in one etcd transaction that checks they are as read;
the new holder drops the replica (a rejoin onto it aborts) and the old
holder keeps its own. A move whose new replica is live already is not
taken back: it finishes when drain or rebalance runs again, and a move the
other way undoes it. Stop the drain or rebalance first, or it plans the
move again. rejoin status lists the moves under way (MOVES).

flags:
`

func runUndoMove(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("undo-move", stderr)
	etcd := newEtcdFlags(fs)
	newClientCertsFlags(fs, etcd, etcdCertsDirUsage, supervise.AdminClient)
	timeout := fs.Duration("timeout", 10*time.Second, "bound of the whole command")
	fs.Usage = func() {
		fmt.Fprint(stderr, undoMoveUsage)
		fs.PrintDefaults()
	}
	pos, err := parseInterspersed(fs, "undo-move", "one PARTITION argument", args, 1, stderr)
	if err != nil {
		return err
	}
	p, err := strconv.ParseUint(pos[0], 10, 32)
	if err != nil {
		fmt.Fprintf(stderr, "rejoin undo-move: %q is not a partition number\n", pos[0])
		return errUsage
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "rejoin undo-move: --timeout %s: want more than 0\n", *timeout)
		return errUsage
	}
	cli, ctx, done, err := openEtcd("undo-move", etcd, *timeout, stderr)
	if err != nil {
		return err
	}
	defer done()
	v, err := supervise.ReadMoves(ctx, cli)
	if err == nil {
		var m supervise.Move
		if m, err = supervise.UndoMove(ctx, cli, v, uint32(p)); err == nil {
			fmt.Fprintf(stdout, "undone   %s: %s's replica removed; %s keeps its own\n", m, m.To, m.From)
			return nil
		}
	}
	if errors.Is(err, supervise.ErrMove) || errors.Is(err, supervise.ErrMoveNotReady) {
		return err
	}
	return etcd.explain(etcdErr(ctx, etcd.endpoints, *timeout, err))
}
