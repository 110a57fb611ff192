package main

import (
	"fmt"
	"io"

	"github.com/rejoin-db/rejoin/recovery/supervise"
)

const rebalanceUsage = `usage: rejoin rebalance --etcd ENDPOINTS [flags]

Moves replicas between the running nodes until each holds as many as
the others, within one: after 'rejoin node --id N' added a node with a
new id, it takes its share, while writes go on. Each move adds a replica
of the partition on the node with the fewest replicas; that node
rebuilds it by a rejoin (the same claims, fencing and supervision as a
restart); once it is live, the replica on the node with the most is
removed in one etcd transaction that checks it, and that node drops it.
No partition ever has fewer live replicas than before its move. Only
running nodes count: a dead node's replicas are 'rejoin replace''s.

It finishes the moves under way first, a drain's too. While a move is
under way it prints what the move waits for, when that changes and every
--say-every; a move whose new holder opens no rejoin task within --stall
is undone, and rebalance fails naming it.

An interrupted rebalance (Ctrl-C: exit status 130) says which moves are
under way and goes on where it stopped when run again.

flags:
`

func runRebalance(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rebalance", stderr)
	mf := newMoveFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, rebalanceUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, "rebalance", args, stderr); err != nil {
		return err
	}
	if err := mf.check(); err != nil {
		fmt.Fprintf(stderr, "rejoin rebalance: %s\n", userMessage("rebalance", err, nil))
		return errUsage
	}
	lim := mf.limits()
	return runMoves("rebalance", mf, stdout, stderr, func(s supervise.MoveState) ([]supervise.Move, bool, error) {
		return supervise.PlanRebalance(s, lim)
	}, "the running nodes hold replicas within one of each other", "rejoin rebalance", nil)
}
