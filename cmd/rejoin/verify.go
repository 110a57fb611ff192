package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
	"github.com/rejoin-db/rejoin/recovery/client"
)

// errMismatch makes run exit 1 after verify printed its report.
var errMismatch = errors.New("digests do not match")

func runVerify(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("verify", stderr)
	etcd := newEtcdFlags(fs)
	nodeTLS := newClientTLSFlags(fs, etcd)
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	timeout := fs.Duration("timeout", 30*time.Second, "bound of the whole check")
	if err := parseFlags(fs, "verify", args, stderr); err != nil {
		return err
	}
	creds, err := nodeTLS.load()
	if err != nil {
		fmt.Fprintf(stderr, "rejoin verify: %v\n", err)
		return errUsage
	}
	cli, ctx, done, err := openEtcd("verify", etcd, *timeout, stderr)
	if err != nil {
		return err
	}
	defer done()
	c, err := client.Open(ctx, cli, client.Options{TLS: creds})
	if err != nil {
		return err
	}
	defer c.Close()
	rep, err := clusterview.CheckDigests(ctx, cli, c)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		if err := clusterview.RenderDigests(stdout, rep); err != nil {
			return err
		}
	}
	return verdict(rep)
}

// verdict is nil when every partition matched, else an error naming the
// partitions that did not.
func verdict(rep clusterview.DigestReport) error {
	if rep.OK() {
		return nil
	}
	if len(rep.Partitions) == 0 {
		return fmt.Errorf("%w: no partition answered", errMismatch)
	}
	return fmt.Errorf("%w: partitions %v", errMismatch, rep.Bad)
}
