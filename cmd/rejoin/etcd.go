package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

const etcdUsage = `usage: rejoin etcd --data DIR [--port PORT] [--certs-dir DIR]

Runs the embedded etcd of the default single-machine setup (the one
'rejoin demo' starts) as a process of its own, on loopback ports, so that
it can be paused (SIGSTOP) or stopped apart from the nodes: the demo's
--fault pause-etcd does, and README's walk-through runs it as the
cluster's etcd (--port 2379, etcd's own default). With --certs-dir it
serves https only and requires a client certificate from that
directory's CA (a node's or a client's), with its server certificate
etcd.crt and etcd.key from there ('rejoin cert create-etcd' writes
them), and at its first start turns on etcd's authentication with the
cluster's roles: a certificate is then the etcd user of its CommonName,
the admin (client root) may do anything, and the admin gives nodes and
readers their users ('rejoin init', 'replace', 'access'); every command given --certs-dir and an https:// --etcd then uses
that directory's ca.crt and its own certificate as etcd's client
(--etcd-cacert, --etcd-cert and --etcd-key name others). Once serving it prints
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
	certsDir := fs.String("certs-dir", "", "certificates `directory`: serve TLS with its etcd.crt and etcd.key, and require client certificates from its ca.crt")
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
	var err error
	if *port < 0 || *port > 65535 {
		fmt.Fprintf(stderr, "rejoin etcd: --port %d: want 0..65535\n", *port)
		return errUsage
	}
	opts := claim.EmbeddedOptions{ClientPort: *port}
	if *certsDir != "" {
		if opts.TLS, err = embeddedTLS(*certsDir); err != nil {
			fmt.Fprintf(stderr, "rejoin etcd: --certs-dir: %v\n", err)
			return errUsage
		}
		opts.Setup = setupLocalAccess
	}
	e, err := claim.StartEmbedded(*dir, opts)
	if err != nil {
		return err
	}
	defer e.Stop()
	fmt.Fprintln(stdout, demo.EtcdReadyPrefix+strings.Join(e.Endpoints(), ","))
	<-ctx.Done()
	return nil
}

// embeddedTLS are the TLS files of an embedded etcd in a certificates
// directory, each checked to be there: etcd's own error would come later
// and less plainly.
func embeddedTLS(dir string) (*claim.EmbeddedTLS, error) {
	cert, key := certs.EtcdFiles(dir)
	t := &claim.EmbeddedTLS{CertFile: cert, KeyFile: key, TrustedCAFile: filepath.Join(dir, certs.CACertFile)}
	for _, f := range []string{t.CertFile, t.KeyFile, t.TrustedCAFile} {
		if _, err := os.Stat(f); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// setupLocalAccess turns on etcd's authentication of a new embedded etcd
// (docs/DESIGN.md "Who may write etcd"): the roles, the admin
// (client:root, etcd's root role), and no node or client user yet, which
// the admin adds (init, replace, access). It runs in this process before
// the client port serves (claim.EmbeddedOptions.Setup): until
// authentication is on, every certificate of the CA may do anything, and
// with the port open meanwhile any of them could have written what it
// liked before the first start's setup ended.
func setupLocalAccess(ctx context.Context, cli *clientv3.Client, authEnabled bool) error {
	if authEnabled {
		return nil
	}
	if err := supervise.SetupAccess(ctx, cli, supervise.Access{Enable: true}); err != nil {
		return fmt.Errorf("rejoin etcd: set up etcd's roles: %w", err)
	}
	return nil
}
