package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/txnid"
)

const initUsage = `usage: rejoin init --etcd ENDPOINTS [--partitions N] [--replicas R] [--nodes NODES] [--table SPEC]...

Creates a cluster in an existing etcd: its shape (partitions, replicas,
tables) and the placement of every partition's replicas on the nodes,
every replica live. Where etcd's authentication is on, it gives the nodes
of --nodes their etcd users first (as 'rejoin access' does); --etcd-auth
sets the roles up and turns it on, the one step an etcd of your own needs
(docs/DESIGN.md "Who may write etcd"). Start the nodes after it ('rejoin node --id N', one
per node of --nodes); a node started before waits for it. Fails if etcd
already holds a cluster. An init that was interrupted is run again as it
was: it takes over what the first one left.

--nodes is a count (3: nodes n1, n2, n3) or a comma-separated list of
node ids (n1,n2,n5 or 1,2,5): the N of 'rejoin node --id N'.

--table SPEC, repeatable, is NAME(COLUMN TYPE [key], ...) with types
int64, float64, string and bytes; the columns marked key make the
primary key (the first column if none is marked). Without --table the
cluster has the table kv(k bytes key, v bytes), the one 'rejoin put',
'get', 'del' and 'load' use by default.

flags:
`

// tableFlags collects repeated --table specs.
type tableFlags []layout.Table

func (t *tableFlags) String() string {
	var out []string
	for _, tb := range *t {
		out = append(out, tableSpec(tb))
	}
	return strings.Join(out, " ")
}

func (t *tableFlags) Set(s string) error {
	tb, err := parseTableSpec(s)
	if err != nil {
		return errors.New(userMessage("init", err, nil))
	}
	*t = append(*t, tb)
	return nil
}

// parseTableSpec reads NAME(COLUMN TYPE [key], ...).
func parseTableSpec(s string) (layout.Table, error) {
	s = strings.TrimSpace(s)
	name, rest, ok := strings.Cut(s, "(")
	if !ok || !strings.HasSuffix(rest, ")") {
		return layout.Table{}, fmt.Errorf("table %q: want NAME(COLUMN TYPE [key], ...)", s)
	}
	t := layout.Table{Name: strings.TrimSpace(name)}
	if t.Name == "" {
		return layout.Table{}, fmt.Errorf("table %q: no name", s)
	}
	for i, col := range strings.Split(strings.TrimSuffix(rest, ")"), ",") {
		f := strings.Fields(col)
		switch {
		case len(f) == 3 && f[2] == "key":
			t.Key = append(t.Key, i)
		case len(f) != 2:
			return layout.Table{}, fmt.Errorf("table %q: column %q: want NAME TYPE [key]", t.Name, strings.TrimSpace(col))
		}
		t.Columns = append(t.Columns, layout.Column{Name: f[0], Type: f[1]})
	}
	if len(t.Key) == 0 {
		t.Key = []int{0}
	}
	if _, err := t.Schema(); err != nil {
		return layout.Table{}, err
	}
	return t, nil
}

// tableSpec is t in parseTableSpec's syntax.
func tableSpec(t layout.Table) string {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = c.Name + " " + c.Type
		for _, k := range t.Key {
			if k == i {
				cols[i] += " key"
			}
		}
	}
	return t.Name + "(" + strings.Join(cols, ", ") + ")"
}

// parseNodes reads --nodes: a count, or a list of node ids.
func parseNodes(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil && !strings.Contains(s, ",") {
		if n < 1 || n >= int(txnid.InitiatorsMax) {
			return nil, fmt.Errorf("--nodes %d: want 1..%d nodes", n, txnid.InitiatorsMax-1)
		}
		out := make([]string, n)
		for i := range out {
			out[i] = node.NodeName(i + 1)
		}
		return out, nil
	}
	var out []string
	for _, item := range splitEndpoints(s) {
		n, err := strconv.Atoi(strings.TrimPrefix(item, "n"))
		if err != nil || n < 1 || n >= int(txnid.InitiatorsMax) {
			return nil, fmt.Errorf("--nodes: %q is not a node id (n1..n%d, the N of rejoin node --id N)", item, txnid.InitiatorsMax-1)
		}
		out = append(out, node.NodeName(n))
	}
	if len(out) == 0 {
		return nil, errors.New("--nodes: no node")
	}
	return out, nil
}

func runInit(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("init", stderr)
	etcd := newEtcdFlags(fs)
	newClientCertsFlags(fs, etcd, etcdCertsDirUsage, supervise.AdminClient)
	partitions := fs.Uint("partitions", 4, "partitions (1..65536)")
	replicas := fs.Int("replicas", 2, "replicas of each partition, each on its own node")
	nodesFlag := fs.String("nodes", "3", "the nodes: a `count` (n1..nN) or a comma-separated list of node ids")
	var tables tableFlags
	fs.Var(&tables, "table", "a table, `NAME(COLUMN TYPE [key], ...)`; repeatable (default kv(k bytes key, v bytes))")
	etcdAuth := fs.Bool("etcd-auth", false, "set up etcd's roles and the users of the admin (client root), of the nodes of --nodes and of the client commands (client app, a reader), and turn etcd's authentication on (an etcd of your own that requires client certificates, --client-cert-auth: etcd then takes a certificate's CommonName as its user); run before auth is on, or as etcd's root")
	timeout := fs.Duration("timeout", 30*time.Second, "bound of the whole init")
	fs.Usage = func() {
		fmt.Fprint(stderr, initUsage)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, "init", args, stderr); err != nil {
		return err
	}
	nodes, err := parseNodes(*nodesFlag)
	switch {
	case err != nil:
	case *partitions < 1 || *partitions > 1<<16:
		err = fmt.Errorf("--partitions %d, want 1..65536", *partitions)
	case *replicas < 1 || *replicas > len(nodes) || *replicas > 16:
		err = fmt.Errorf("--replicas %d with %d nodes: want 1..%d, each replica of a partition on its own node", *replicas, len(nodes), min(len(nodes), 16))
	}
	if err != nil {
		fmt.Fprintf(stderr, "rejoin init: %v\n", err)
		return errUsage
	}
	if len(tables) == 0 {
		tables = tableFlags{layout.KV()}
	}
	cfg := layout.Config{Partitions: uint32(*partitions), Replicas: *replicas, Tables: tables}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "rejoin init: %s\n", userMessage("init", err, nil))
		return errUsage
	}
	cli, ctx, done, err := openEtcd("init", etcd, *timeout, stderr)
	if err != nil {
		return err
	}
	defer done()
	start := time.Now()
	// The nodes' etcd users first: with auth on, a node without one cannot
	// register (the cluster's own etcd, rejoin etcd, has it on already);
	// and the client commands' (appClient), a reader.
	on, err := supervise.AuthEnabled(ctx, cli)
	if err == nil && (on || *etcdAuth) {
		err = supervise.SetupAccess(ctx, cli, supervise.Access{Nodes: nodes, Clients: []string{appClient}, Enable: *etcdAuth})
	}
	if err != nil {
		return etcd.explain(etcdErr(ctx, etcd.endpoints, *timeout, err))
	}
	if err := layout.Init(ctx, cli, cfg, nodes); err != nil {
		if errors.Is(err, layout.ErrConfig) {
			fmt.Fprintf(stderr, "rejoin init: %s\n", userMessage("init", err, nil))
			return errUsage
		}
		if errors.Is(err, layout.ErrExists) {
			if have, rerr := layout.Read(ctx, cli); rerr == nil {
				return fmt.Errorf("etcd at %s already holds a cluster (%d partitions x %d replicas); nothing changed", etcd.endpoints, have.Partitions, have.Replicas)
			}
		}
		return etcd.explain(etcdErr(ctx, etcd.endpoints, *timeout, err))
	}
	fmt.Fprintf(stdout, "initialised the cluster in %.2f s: %d partitions x %d replicas on %s; tables %s\n",
		time.Since(start).Seconds(), cfg.Partitions, cfg.Replicas, strings.Join(nodes, ","), tables.String())
	fmt.Fprintf(stdout, "start each node: rejoin node --id N --etcd %s --data DIR --certs-dir CERTS  (N of %s; rejoin cert makes CERTS)\n", etcd.endpoints, strings.Join(nodes, ","))
	return nil
}

// etcdErr names the bound when err is etcd not answering within it.
func etcdErr(ctx context.Context, endpoints string, timeout time.Duration, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("etcd at %s did not answer within %s (--timeout): %w", endpoints, timeout, err)
	}
	return err
}
