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

const verifyUsage = `usage: rejoin verify --etcd ENDPOINTS [flags]

Compares the replicas of every partition: one read-only transaction per
partition asks each replica for its digest and row count, so all of a
partition's replicas answer at the same txn ID, and prints a line per
replica. A partition matches when as many replicas answered as etcd has
live and all agree.

Exit status 1 when digests differ; 3 when some partition could not be
compared at all (no node reached, answers short): nothing read is not a
mismatch.

flags:
`

func runVerify(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("verify", stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, verifyUsage)
		fs.PrintDefaults()
	}
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

// verdict is nil when every partition matched; errMismatch (exit 1) when
// some replicas answered different digests; exitUncertain (3) when some
// partition could not be compared (no node reached, short answers): what
// was not read is not called a mismatch.
func verdict(rep clusterview.DigestReport) error {
	if rep.OK() {
		return nil
	}
	unread := rep.Unread()
	if rep.Differ() {
		if len(unread) > 0 {
			return fmt.Errorf("%w: partitions %v (and partitions %v could not be compared)", errMismatch, differing(rep), unread)
		}
		return fmt.Errorf("%w: partitions %v", errMismatch, differing(rep))
	}
	if len(rep.Partitions) == 0 || len(unread) == len(rep.Partitions) {
		why := "the cluster has no partition"
		if len(rep.Partitions) > 0 {
			why = "partition 0: " + rep.Partitions[0].Problem
		}
		return &exitError{exitUncertain, fmt.Errorf("no partition could be compared: unreachable (%s)", why)}
	}
	return &exitError{exitUncertain, fmt.Errorf("partitions %v could not be compared: unreachable or short of answers (the others match); run it again", unread)}
}

func differing(rep clusterview.DigestReport) []uint32 {
	var out []uint32
	for _, p := range rep.Partitions {
		if p.Differ {
			out = append(out, p.Partition)
		}
	}
	return out
}
