package client

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/client/clienttest"
)

// TestMain checks that no goroutine outlives the package's tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// checkLeaks verifies, after every other cleanup of t (call it first),
// that no goroutine is left.
func checkLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// env is an embedded etcd, a fake cluster and its nodes, registered.
type env struct {
	etcd    *claim.Embedded
	cli     *clientv3.Client
	cluster *clienttest.Cluster
	nodes   []*clienttest.Node
}

func newEnv(t testing.TB, partitions uint32, nodes int, hook clienttest.Hook) *env {
	t.Helper()
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	cl, err := clienttest.NewCluster(partitions, clienttest.KVSchema())
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	if err := clienttest.WriteCluster(ctx, cli, partitions, clienttest.KVSchema()); err != nil {
		t.Fatal(err)
	}
	v := &env{etcd: e, cli: cli, cluster: cl}
	for i := range nodes {
		id := "n" + string(rune('1'+i))
		n, err := clienttest.StartNode(cl, id, hook)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Close)
		if err := clienttest.RegisterNode(ctx, cli, id, n.Addr()); err != nil {
			t.Fatal(err)
		}
		v.nodes = append(v.nodes, n)
	}
	return v
}

func (v *env) open(t testing.TB, opts Options) *Client {
	t.Helper()
	c, err := Open(testCtx(t, 10*time.Second), v.cli, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
