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

const etcdUsage = `usage: rejoin etcd --data DIR

Runs the embedded etcd of the default single-machine setup (the one
'rejoin demo' starts) as a process of its own, on loopback ports, so that
it can be paused (SIGSTOP) or stopped apart from the nodes: the demo's
--fault pause-etcd does. Once serving it prints one line on stdout:
  ready etcd=<client URL>
SIGINT or SIGTERM stop it cleanly. Not listed by 'rejoin help': an
internal of the demo and the tests.

flags:
`

func runEtcd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("etcd", stderr)
	dir := fs.String("data", "", "data `directory` of the etcd server")
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
	e, err := claim.StartEmbedded(*dir, claim.EmbeddedOptions{})
	if err != nil {
		return err
	}
	defer e.Stop()
	fmt.Fprintln(stdout, demo.EtcdReadyPrefix+strings.Join(e.Endpoints(), ","))
	<-ctx.Done()
	return nil
}
