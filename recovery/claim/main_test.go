package claim

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the package's tests. No
// goroutine needs ignoring: Embedded.Stop waits for every goroutine of the
// server (etcd's Err channel closes after the last one), every client is
// closed at cleanup, and a claim's goroutines end with Release or the loss.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// checkLeaks verifies, after every other cleanup of t (it must be called
// first, cleanups run last-in first-out), that no goroutine is left.
func checkLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// startEtcd starts an embedded etcd in a temporary dir, stopped at cleanup.
func startEtcd(t *testing.T) *Embedded {
	t.Helper()
	e, err := StartEmbedded(t.TempDir(), EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}

// newClient returns a client of e (or of endpoints, e.g. a proxy's),
// closed at cleanup.
func newClient(t *testing.T, e *Embedded, endpoints ...string) *clientv3.Client {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = e.Endpoints()
	}
	cli, err := clientv3.New(loopbackClientConfig(endpoints, e.log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
