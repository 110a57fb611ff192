package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

const certUsage = `usage: rejoin cert <create-ca | create-node N | create-client NAME | create-etcd> --certs-dir DIR [flags]

Writes a cluster's certificates (ECDSA P-256, for TLS 1.3):
  create-ca           DIR/ca.crt and CADIR/ca.key: the cluster CA; its key
                      goes to --ca-dir (default DIR-ca, beside DIR),
                      never into DIR, which every node is given
  create-node N       DIR/node.n<N>.crt and .key: node n<N>, which may feed
                      as initiator N and rejoin and repair as n<N>
  create-client NAME  DIR/client.<NAME>.crt and .key: a client, which may
                      only call procedures; 'root' is the cluster's admin
                      under etcd's authentication (init, replace, drain,
                      rebalance, undo-move, accept-loss, access)
  create-etcd         DIR/etcd.crt and .key: the server certificate of
                      'rejoin etcd --certs-dir DIR' (for --host), which
                      then requires a node's or client's certificate of
                      every etcd client: a command given --certs-dir DIR
                      and an https:// --etcd uses DIR's ca.crt and its
                      own certificate there (or --etcd-cacert,
                      --etcd-cert, --etcd-key)
create-node, create-client and create-etcd need CADIR/ca.key. Nothing is
overwritten; every file is synced to disk before the command returns.
Every node and client needs DIR/ca.crt and its own pair; keep CADIR where
certificates are issued, not on the nodes.

flags:
`

func runCert(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("cert", stderr)
	dir := fs.String("certs-dir", os.Getenv(envCertsDir), "certificates `directory` (made if missing; $REJOIN_CERTS_DIR if not given)")
	caDir := fs.String("ca-dir", "", "`directory` of the CA's key, ca.key (default: the certificates directory's name with -ca, beside it); never the certificates directory, which every node is given")
	lifetime := fs.Duration("lifetime", 0, "validity from now (0: 87600h for a CA, 17520h for a node or client)")
	hosts := fs.String("host", "localhost,127.0.0.1,::1", "create-node, create-etcd: comma-separated DNS names and IPs for clients that check a host name (the admin HTTP, etcd's clients); the node protocol checks the identity instead")
	fs.Usage = func() {
		fmt.Fprint(stderr, certUsage)
		fs.PrintDefaults()
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fs.Usage()
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return flag.ErrHelp
		}
		return errUsage
	}
	verb, rest := args[0], args[1:]
	var name string
	if verb != "create-ca" && verb != "create-etcd" && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	extra := fs.Args()
	if name == "" && verb != "create-ca" && verb != "create-etcd" && len(extra) > 0 {
		name, extra = extra[0], extra[1:] // `create-node --certs-dir d 3`
	}
	if len(extra) > 0 {
		fmt.Fprintf(stderr, "rejoin cert: unexpected argument %q\n", extra[0])
		return errUsage
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "rejoin cert: --certs-dir is required")
		return errUsage
	}
	if *lifetime < 0 {
		fmt.Fprintf(stderr, "rejoin cert: --lifetime %s: want > 0\n", *lifetime)
		return errUsage
	}
	if *caDir == "" {
		*caDir = certs.CADir(*dir)
	}
	var o certs.IssueOptions
	if *lifetime > 0 {
		o.NotAfter = time.Now().Add(*lifetime)
	}
	var id certs.Identity
	switch verb {
	case "create-ca":
		lt := *lifetime
		if lt == 0 {
			lt = certs.CALifetimeDefault
		}
		ca, err := certs.CreateCAAt(*dir, *caDir, lt)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s and %s (CA valid until %s); give the nodes %s, keep %s where certificates are issued\n",
			filepath.Join(*dir, certs.CACertFile), filepath.Join(*caDir, certs.CAKeyFile), ca.Cert.NotAfter.UTC().Format(time.DateOnly), *dir, *caDir)
		return nil
	case "create-node":
		n, err := strconv.Atoi(name)
		if err != nil {
			fmt.Fprintf(stderr, "rejoin cert: create-node %q: want the node's number N (its id is n<N>)\n", name)
			return errUsage
		}
		id = certs.NodeID(n)
		o.Hosts = splitEndpoints(*hosts)
	case "create-client":
		id = certs.ClientID(name)
	case "create-etcd":
		o.Hosts = splitEndpoints(*hosts)
		cf, kf, err := certs.CreateEtcdAt(*dir, *caDir, o)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s and %s (etcd's server certificate for %s)\n", cf, kf, strings.Join(o.Hosts, ","))
		return nil
	default:
		fmt.Fprintf(stderr, "rejoin cert: unknown action %q: want create-ca, create-node, create-client or create-etcd\n", verb)
		return errUsage
	}
	if err := id.Check(); err != nil {
		fmt.Fprintf(stderr, "rejoin cert: %s\n", userMessage("cert", err, nil))
		return errUsage
	}
	cf, kf, err := certs.CreateAt(*dir, *caDir, id, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s and %s (%s)\n", cf, kf, id)
	return nil
}

// clientCertsFlags are a client command's certificate: --certs-dir and
// --client. They are its etcd client's certificate too, for an https://
// --etcd (etcdFlags.useCertsDir).
type clientCertsFlags struct {
	certsDir, name string
}

// appClient is the client name of the commands that read and write the
// data (put, get, load, status, verify): a reader in etcd, which init
// gives its user. The admin's (supervise.AdminClient, root) is the
// default of the commands that change the cluster (init, replace, drain,
// rebalance, undo-move, accept-loss, access) only: a client command run as the admin
// could do anything the admin may in etcd, so by default every user of
// the CLI was the admin.
const appClient = "app"

// newClientCertsFlags binds --certs-dir (described by dirUsage) and
// --client, def by default, and makes them etcd's defaults.
func newClientCertsFlags(fs *flag.FlagSet, etcd *etcdFlags, dirUsage, def string) *clientCertsFlags {
	f := &clientCertsFlags{}
	fs.StringVar(&f.certsDir, "certs-dir", os.Getenv(envCertsDir), dirUsage+" ($REJOIN_CERTS_DIR if not given)")
	fs.StringVar(&f.name, "client", envOr(envClient, def), "client certificate `name` in --certs-dir ($REJOIN_CLIENT if not given)")
	etcd.useCertsDir(&f.certsDir, func() certs.Identity { return certs.ClientID(f.name) })
	return f
}

// etcdCertsDirUsage is --certs-dir's usage in a command that reaches
// only etcd.
const etcdCertsDirUsage = "certificates `directory`: for an https:// --etcd, its ca.crt and client.<NAME>.crt and .key (`rejoin cert create-client NAME`) are the etcd client's CA and certificate"

// clientTLSFlags are how a command that calls procedures (verify) dials
// the nodes: a client certificate, or --insecure for nodes that run
// without TLS.
type clientTLSFlags struct {
	*clientCertsFlags
	insecure bool
}

func newClientTLSFlags(fs *flag.FlagSet, etcd *etcdFlags) *clientTLSFlags {
	f := &clientTLSFlags{clientCertsFlags: newClientCertsFlags(fs, etcd,
		"certificates `directory` with ca.crt and client.<NAME>.crt and .key (`rejoin cert create-client NAME`): the nodes', and for an https:// --etcd etcd's, client certificate", appClient)}
	fs.BoolVar(&f.insecure, "insecure", false, "dial the nodes without TLS (nodes run with --insecure)")
	return f
}

// load is the client's credentials; nil with --insecure.
func (f *clientTLSFlags) load() (*certs.TLS, error) {
	if f.insecure && f.certsDir == os.Getenv(envCertsDir) {
		return nil, nil // --insecure given wins over $REJOIN_CERTS_DIR
	}
	switch {
	case f.insecure && f.certsDir != "":
		return nil, errors.New("--certs-dir and --insecure both given: pick one")
	case f.insecure:
		return nil, nil
	case f.certsDir == "":
		return nil, errors.New("--certs-dir is required to reach the nodes (a client certificate: `rejoin cert create-client NAME`), or --insecure for nodes that run without TLS")
	}
	return certs.Load(f.certsDir, certs.ClientID(f.name))
}
