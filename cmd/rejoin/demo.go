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

Built so far: txn IDs and safe points (txnid), the in-memory partition with
its digest, procedures and ordered executor (partition), and the tuple,
message and frame formats (wire). Run the tests with: go test -race ./...
`
