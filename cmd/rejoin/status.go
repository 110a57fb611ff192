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
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
)

// openEtcd returns a client of the comma-separated endpoints; quiet.
func openEtcd(endpoints string) (*clientv3.Client, error) {
	eps := splitEndpoints(endpoints)
	if len(eps) == 0 {
		return nil, errors.New("--etcd is required")
	}
	return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
}

func runStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", stderr)
	etcd := fs.String("etcd", "", "comma-separated etcd `endpoints`")
	asJSON := fs.Bool("json", false, "print one JSON object instead of tables")
	timeout := fs.Duration("timeout", 5*time.Second, "bound of the whole reading")
	nodeTimeout := fs.Duration("node-timeout", clusterview.StatusTimeoutDefault, "bound of each node's GET /status")
	if err := parseFlags(fs, "status", args, stderr); err != nil {
		return err
	}
	cli, err := openEtcd(*etcd)
	if err != nil {
		fmt.Fprintf(stderr, "rejoin status: %v\n", err)
		return errUsage
	}
	defer cli.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	v, err := clusterview.Read(ctx, cli, &http.Client{}, *nodeTimeout)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return clusterview.Render(stdout, v)
}
