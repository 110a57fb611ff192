package supervise

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/recovery/claim"
)

// TestMain checks that no goroutine outlives the package's tests: every
// etcd server is stopped, every client closed, every Run and Node ended.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// checkLeaks verifies, after every other cleanup of t (call it first:
// cleanups run last-in first-out), that no goroutine is left.
func checkLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// startEtcd starts an embedded etcd (recovery/claim's) in a temporary dir,
// stopped at cleanup.
func startEtcd(t *testing.T) *claim.Embedded {
	t.Helper()
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	return e
}

// newClient returns a client of e, closed at cleanup (closing twice is
// harmless, so a test may close it earlier to play a dead node).
func newClient(t *testing.T, e *claim.Embedded) *clientv3.Client {
	t.Helper()
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// newClientAt returns a client of the etcd at endpoint (a proxy's).
func newClientAt(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// testLog is a logger that writes to the test output with -v and to
// nowhere otherwise.
func testLog(t *testing.T) *slog.Logger {
	var w io.Writer = io.Discard
	if testing.Verbose() {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
}

// waitFor polls cond every 20 ms until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
