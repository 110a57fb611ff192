package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

// openEtcd opens a client of the etcd that ef names for command name,
// and a context that ends on Ctrl-C or after timeout. done releases both.
// A missing or bad --etcd (or TLS or user flag) is errUsage, said on
// stderr.
func openEtcd(name string, ef *etcdFlags, timeout time.Duration, stderr io.Writer) (cli *clientv3.Client, ctx context.Context, done func(), err error) {
	cfg, err := ef.config()
	if err == nil {
		cli, err = clientv3.New(cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rejoin %s: %v\n", name, err)
		return nil, nil, nil, errUsage
	}
	if err := ef.check(); err != nil {
		cli.Close()
		return nil, nil, nil, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return cli, ctx, func() {
		cancel()
		stop()
		cli.Close()
	}, nil
}

const statusUsage = `usage: rejoin status --etcd ENDPOINTS [flags]

Shows a cluster as etcd and its nodes see it: the nodes (registered, and
those of the placement that are down), every replica (its state in etcd
and as its node reports it: rows, digest, last txn), the moves under way
(drain, rebalance), and the rejoin tasks (source, phase, rows, progress).
--watch redraws a line per replica being rebuilt every --every until
Ctrl-C: what is under way, not what is done.

Exit status 5 when no node is registered (the cluster serves nothing).

flags:
`

func runStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, statusUsage)
		fs.PrintDefaults()
	}
	etcd := newEtcdFlags(fs)
	cf := newClientCertsFlags(fs, etcd, "certificates `directory` with ca.crt and client.<NAME>.crt and .key (`rejoin cert create-client NAME`): etcd's client certificate for an https:// --etcd, and the nodes' where their admin HTTP is off loopback (served over TLS)", appClient)
	asJSON := fs.Bool("json", false, "print one JSON object instead of tables")
	timeout := fs.Duration("timeout", 5*time.Second, "bound of the whole reading")
	nodeTimeout := fs.Duration("node-timeout", clusterview.StatusTimeoutDefault, "bound of each node's GET /status")
	watch := fs.Bool("watch", false, "redraw every --every a line per rejoining replica (partition, source→destination, phase, rows, MB/s, change-log bytes, throttle) until interrupted; --timeout bounds each redraw")
	every := fs.Duration("every", time.Second, "period of --watch's redraws")
	count := fs.Int("count", 0, "with --watch, stop after this many redraws (0: until interrupted)")
	if err := parseFlags(fs, "status", args, stderr); err != nil {
		return err
	}
	switch {
	case *every <= 0:
		fmt.Fprintf(stderr, "rejoin status: --every %s: want > 0\n", *every)
		return errUsage
	case *count < 0:
		fmt.Fprintf(stderr, "rejoin status: --count %d: want >= 0\n", *count)
		return errUsage
	case (*count > 0 || *every != time.Second) && !*watch:
		fmt.Fprintln(stderr, "rejoin status: --count and --every go with --watch")
		return errUsage
	}
	bound := *timeout
	if *watch {
		bound = watchForever // each redraw has its own --timeout
	}
	cli, ctx, done, err := openEtcd("status", etcd, bound, stderr)
	if err != nil {
		return err
	}
	defer done()
	// Without the config there is no cluster, only what an init may have
	// half written (layout.Init writes the config last).
	if _, err := layout.Read(ctx, cli); err != nil {
		if errors.Is(err, layout.ErrMissing) {
			return fmt.Errorf("etcd at %s holds no cluster (create one with rejoin init): %w", etcd.endpoints, err)
		}
		return etcd.explain(etcdErr(ctx, etcd.endpoints, *timeout, err))
	}
	hc := &http.Client{}
	if cf.certsDir != "" {
		creds, err := certs.Load(cf.certsDir, certs.ClientID(cf.name))
		if err != nil {
			return err
		}
		hc.Transport = &http.Transport{TLSClientConfig: creds.DialConfig("")}
	}
	if *watch {
		return watchRejoins(ctx, cli, hc, stdout, watchConfig{every: *every, count: *count, timeout: *timeout, nodeTimeout: *nodeTimeout})
	}
	v, err := clusterview.Read(ctx, cli, hc, *nodeTimeout)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(v)
	} else {
		err = clusterview.Render(stdout, v)
	}
	if err == nil && len(v.Nodes) == 0 {
		ids := make([]string, len(v.Down))
		for i, d := range v.Down {
			ids[i] = d.ID
		}
		return &exitError{exitDown, fmt.Errorf("no node is registered: the cluster serves nothing (its placement's nodes %s are down, or cannot reach etcd)", strings.Join(ids, ", "))}
	}
	return err
}
