package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
	"github.com/rejoin-db/rejoin/recovery/claim"
)

const etcdUsage = `usage: rejoin etcd --data DIR [--port PORT]

Runs the embedded etcd of the default single-machine setup (the one
'rejoin demo' starts) as a process of its own, on loopback ports, so that
it can be paused (SIGSTOP) or stopped apart from the nodes: the demo's
--fault pause-etcd does, and README's walk-through runs it as the
cluster's etcd (--port 2379, etcd's own default). Once serving it prints
one line on stdout:
  ready etcd=<client URL>
SIGINT or SIGTERM stop it cleanly. Not listed by 'rejoin help': an
internal of the demo, the tests and the walk-through; a real cluster runs
a real etcd.

flags:
`

func runEtcd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("etcd", stderr)
	dir := fs.String("data", "", "data `directory` of the etcd server")
	port := fs.Int("port", 0, "client `port` on 127.0.0.1 (0: a free one)")
	fs.Usage = func() {
		fmt.Fprint(stderr, etcdUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, "etcd", args, stderr); err != nil {
		return err
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "rejoin etcd: --data is required")
		return errUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *port < 0 || *port > 65535 {
		fmt.Fprintf(stderr, "rejoin etcd: --port %d: want 0..65535\n", *port)
		return errUsage
	}
	e, err := claim.StartEmbedded(*dir, claim.EmbeddedOptions{ClientPort: *port})
	if err != nil {
		return err
	}
	defer e.Stop()
	fmt.Fprintln(stdout, demo.EtcdReadyPrefix+strings.Join(e.Endpoints(), ","))
	<-ctx.Done()
	return nil
}
