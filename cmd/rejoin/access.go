package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

const accessUsage = `usage: rejoin access --etcd ENDPOINTS --certs-dir DIR [--node N]... [--reader NAME]... [--admin NAME]...

Gives certificates their etcd users, under etcd's authentication with
client certificates (etcd takes a certificate's CommonName as its user):
  --node N       node n<N>: writes its registration, its incarnation and
                 what a rejoin and the supervisor need; reads the cluster
  --reader NAME  client NAME: reads the cluster, writes nothing
  --admin NAME   client NAME: etcd's root role, for init, replace, drain,
                 rebalance, undo-move, accept-loss and this command
A node whose certificate has no user cannot register: give a new node its
user before its first start ('rejoin init' does for the nodes of its
--nodes, 'rejoin replace' for --with). Run as the admin (client root, the
default --client). What each role may do is in docs/DESIGN.md "Who may
write etcd". An etcd without authentication gets the users unenforced:
'rejoin init --etcd-auth' turns it on; the cluster's own etcd ('rejoin
etcd --certs-dir') has it on from its start.

flags:
`

// listFlag collects a repeatable flag's values.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func runAccess(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("access", stderr)
	etcd := newEtcdFlags(fs)
	newClientCertsFlags(fs, etcd, etcdCertsDirUsage, supervise.AdminClient)
	var nodes, clients, admins listFlag
	fs.Var(&nodes, "node", "a node `N` (n<N>) to give its etcd user; repeatable")
	fs.Var(&clients, "reader", "a client `NAME` to give a read-only etcd user (a scraper, a status watcher); repeatable")
	fs.Var(&admins, "admin", "a client `NAME` to make an admin; repeatable")
	timeout := fs.Duration("timeout", 30*time.Second, "bound of the whole setup")
	fs.Usage = func() {
		fmt.Fprint(stderr, accessUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, "access", args, stderr); err != nil {
		return err
	}
	a := supervise.Access{Admins: admins}
	var err error
	for _, n := range nodes {
		var id string
		if id, err = parseNodeID("node", n); err != nil {
			break
		}
		a.Nodes = append(a.Nodes, id)
	}
	for _, name := range append(clients, admins...) {
		if err == nil {
			err = certs.ClientID(name).Check()
		}
	}
	a.Clients = clients
	if err == nil && len(a.Nodes)+len(a.Clients)+len(a.Admins) == 0 {
		err = errors.New("nothing to give: --node, --reader or --admin")
	}
	if err != nil {
		fmt.Fprintf(stderr, "rejoin access: %s\n", userMessage("access", err, nil))
		return errUsage
	}
	cli, ctx, done, err := openEtcd("access", etcd, *timeout, stderr)
	if err != nil {
		return err
	}
	defer done()
	on, err := supervise.AuthEnabled(ctx, cli)
	if err == nil {
		err = supervise.SetupAccess(ctx, cli, a)
	}
	if err != nil {
		return etcd.explain(etcdErr(ctx, etcd.endpoints, *timeout, err))
	}
	var given []string
	for _, n := range a.Nodes {
		given = append(given, supervise.NodeUser(n))
	}
	for _, c := range a.Clients {
		given = append(given, supervise.ClientUser(c))
	}
	for _, c := range a.Admins {
		given = append(given, supervise.ClientUser(c)+" (admin)")
	}
	fmt.Fprintf(stdout, "etcd users: %s\n", strings.Join(given, ", "))
	if !on {
		fmt.Fprintf(stdout, "etcd at %s does not enforce its authentication: rejoin init --etcd-auth turns it on\n", etcd.endpoints)
	}
	return nil
}
