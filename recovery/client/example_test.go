package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/client"
	"github.com/rejoin-db/rejoin/recovery/client/clienttest"
	"github.com/rejoin-db/rejoin/wire"
)

// Example dials a cluster through its etcd, writes a row, reads it,
// deletes it, and reads it again.
func Example() {
	// startCluster stands in for a running cluster (`rejoin demo`, or
	// `rejoin init` and `rejoin node`): an etcd and a node, on loopback.
	endpoints, stop := startCluster(nil)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The client finds the cluster's shape and its nodes in etcd. A
	// cluster with TLS needs the etcd client's TLS config and
	// client.Options.TLS, a certificate of `rejoin cert create-client`.
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	c, err := client.Open(ctx, cli, client.Options{})
	if err != nil {
		panic(err)
	}
	defer c.Close() // ends the client's goroutines

	// Values are typed; the "kv" table's key is its first column, and the
	// client routes the call to the key's partition.
	key := wire.Bytes([]byte("greeting"))
	if _, err := c.Upsert(ctx, "kv", key, wire.Bytes([]byte("hello"))); err != nil {
		panic(err)
	}
	row, err := c.Read(ctx, "kv", key)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s = %s\n", row[0].Bytes, row[1].Bytes)
	if _, err := c.Delete(ctx, "kv", key); err != nil {
		panic(err)
	}
	_, err = c.Read(ctx, "kv", key)
	fmt.Println("after delete, not found:", errors.Is(err, client.ErrNotFound))
	// Output:
	// greeting = hello
	// after delete, not found: true
}

// Example_errors tells apart what a caller must: a call that surely did
// not happen (retry it or fix it), one that may or may not have happened
// (read back before retrying), and a refusal (nothing was sequenced).
func Example_errors() {
	// This fake node answers some keys as a node in trouble would: it
	// refuses "refused" (as a node not registered in etcd), and applies
	// "lost" but loses every replica before they answer.
	endpoints, stop := startCluster(func(_ string, call *wire.Call) (clienttest.Action, time.Duration) {
		switch {
		case bytes.Contains(call.Params, []byte("refused")):
			return clienttest.Refuse, 0
		case bytes.Contains(call.Params, []byte("lost")):
			return clienttest.Lost, 0
		}
		return clienttest.Answer, 0
	})
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	c, err := client.Open(ctx, cli, client.Options{})
	if err != nil {
		panic(err)
	}
	defer c.Close()

	// The order matters: ErrNotFound comes with ErrProcedure, and a
	// refusal by every node with ErrNoNode. An uncertain call is never
	// resent by the client: a broken connection, a timeout or a node that
	// lost its replicas leaves only the caller to find out.
	describe := func(err error) string {
		switch {
		case err == nil:
			return "done"
		case errors.Is(err, client.ErrInvalid):
			return "invalid, nothing sent: fix the call"
		case errors.Is(err, client.ErrUncertain):
			return "uncertain: it may or may not have happened, read it back"
		case errors.Is(err, client.ErrNotFound):
			return "failed: no such row"
		case errors.Is(err, client.ErrProcedure):
			return "failed: the txn did not commit"
		case errors.Is(err, client.ErrRefused):
			return "refused, nothing sequenced: retry later"
		case errors.Is(err, client.ErrNoNode):
			return "no node reached, nothing sent: retry later"
		}
		return "other: " + err.Error()
	}
	put := func(k, v string) error {
		_, err := c.Upsert(ctx, "kv", wire.Bytes([]byte(k)), wire.Bytes([]byte(v)))
		return err
	}
	fmt.Println("put:", describe(put("a", "1")))
	fmt.Println("4 MiB value:", describe(put("big", strings.Repeat("v", 4<<20))))
	_, err = c.Delete(ctx, "kv", wire.Bytes([]byte("missing")))
	fmt.Println("delete of a missing row:", describe(err))
	_, err = c.Call(ctx, 0, "no_such_procedure", nil)
	fmt.Println("unknown procedure:", describe(err))
	fmt.Println("replicas lost:", describe(put("lost", "1")))
	fmt.Println("node refuses:", describe(put("refused", "1")))
	// Output:
	// put: done
	// 4 MiB value: invalid, nothing sent: fix the call
	// delete of a missing row: failed: no such row
	// unknown procedure: failed: the txn did not commit
	// replicas lost: uncertain: it may or may not have happened, read it back
	// node refuses: refused, nothing sequenced: retry later
}

// startCluster starts what the examples dial, on loopback only: an
// embedded etcd holding a cluster of 4 partitions with the "kv" table,
// and one fake node of package clienttest, which executes calls as a node
// does (hook, if not nil, picks a fault per call) and is registered in
// etcd. stop removes all of it and every goroutine it started.
func startCluster(hook clienttest.Hook) (endpoints []string, stop func()) {
	dir, err := os.MkdirTemp("", "rejoin-client-example-")
	if err != nil {
		panic(err)
	}
	e, err := claim.StartEmbedded(dir, claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		panic(err)
	}
	cli, err := e.Client()
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := clienttest.NewCluster(4, clienttest.KVSchema())
	if err != nil {
		panic(err)
	}
	if err := clienttest.WriteCluster(ctx, cli, 4, clienttest.KVSchema()); err != nil {
		panic(err)
	}
	n, err := clienttest.StartNode(cl, "n1", hook)
	if err != nil {
		panic(err)
	}
	if err := clienttest.RegisterNode(ctx, cli, "n1", n.Addr()); err != nil {
		panic(err)
	}
	return e.Endpoints(), func() {
		n.Close()
		e.Stop()
		_ = os.RemoveAll(dir)
	}
}
