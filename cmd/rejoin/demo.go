package main

import (
	"fmt"
	"io"
)

// runDemo will start a local cluster and rejoin a killed node while writes go
// on. The cluster runtime does not exist yet, so for now the command says
// what it will do and what works today, and exits 0: it claims nothing it
// did not do.
func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rejoin demo: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	fmt.Fprint(stdout, demoPlan)
	return nil
}

const demoPlan = `rejoin demo: not built yet; nothing was started.

When the cluster runtime lands, this command will, on loopback in a temporary
directory:
  1. start an embedded etcd and a cluster of node processes (3 nodes,
     4 partitions, 2 replicas each by default);
  2. create a table, load rows, and start a writer;
  3. kill one node with SIGKILL and restart it;
  4. rejoin each of its partition replicas from a live replica while the
     writer goes on;
  5. check that every replica of every partition has the same digest at a
     common txn ID, and print a summary.

Built so far: the in-memory partition and its executor, the tuple, message
and frame formats, the table stream and change log, the rejoin processors,
claims with fencing epochs in etcd, the node's durable record, and frames
over TCP. What runs today:
  go run ./cmd/rejoin sim --seeds 1000    the seeded rejoin simulator
  go test -race ./...                      the tests
  go test -run='^$' -bench=RejoinInProcess -benchtime=1x ./bench/
`
