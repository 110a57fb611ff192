package claim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestEmbeddedRestart checks the embedded server: loopback listeners only,
// data and revision kept across Stop and Restart on the same ports, and an
// old client reconnecting by itself.
func TestEmbeddedRestart(t *testing.T) {
	checkLeaks(t)
	e := startEtcd(t)
	addrs := []net.Addr{e.etcd.Clients[0].Addr()}
	for _, p := range e.etcd.Peers {
		addrs = append(addrs, p.Addr())
	}
	for _, a := range addrs {
		if ip := a.(*net.TCPAddr).IP; !ip.IsLoopback() {
			t.Errorf("listening on %s, not loopback", a)
		}
	}
	cli := newClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	put, err := cli.Put(ctx, "k", "v")
	if err != nil {
		t.Fatal(err)
	}
	before := e.Endpoints()
	e.Stop()
	e.Stop() // stopping a stopped server does nothing
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	if after := e.Endpoints(); after[0] != before[0] {
		t.Errorf("endpoints moved from %v to %v", before, after)
	}
	got, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" || got.Header.Revision != put.Header.Revision {
		t.Fatalf("after restart: %v at revision %d, wrote at %d", got.Kvs, got.Header.Revision, put.Header.Revision)
	}
	// A second server on the same data dir and ports cannot start.
	quiet := EmbeddedOptions{ClientPort: e.clientPort, PeerPort: e.peerPort, ReadyTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if _, err := StartEmbedded(e.dir, quiet); err == nil {
		t.Fatal("second server on the same dir and ports started")
	}
}

// TestEmbeddedSetupBeforeServing: EmbeddedOptions.Setup runs while the
// client port serves no one (a dial there is refused), with a client
// that writes, and what it wrote is there once the port serves; the
// setup's unix socket and its directory are gone afterwards. A failing
// setup ends the start with its error and nothing left serving.
func TestEmbeddedSetupBeforeServing(t *testing.T) {
	checkLeaks(t)
	// The socket directories counted are this test's own: another
	// package's tests start embedded servers beside it (a .ci/run saw
	// two during the setup, the other cmd/rejoin's). Short, for the
	// socket's path.
	tmp, err := os.MkdirTemp("", "rjt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	t.Setenv("TMPDIR", tmp)
	port, err := pickPort(0)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	socks := func() []string {
		m, err := filepath.Glob(filepath.Join(os.TempDir(), "rejoin-etcd-setup-*"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := socks()
	var during []string
	ran := 0
	setup := func(ctx context.Context, cli *clientv3.Client, authEnabled bool) error {
		ran++
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return fmt.Errorf("the client port %s took a connection during the setup", addr)
		}
		if authEnabled {
			return errors.New("auth on in a new server")
		}
		_, err := cli.Put(ctx, "set-up", "yes")
		return err
	}
	dir := t.TempDir()
	e, err := StartEmbedded(dir, EmbeddedOptions{ClientPort: port, UnsafeNoFsync: true, Logger: zap.NewNop(),
		Setup: func(ctx context.Context, cli *clientv3.Client, on bool) error {
			during = socks()
			return setup(ctx, cli, on)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if ran != 1 {
		t.Fatalf("setup ran %d times, want once", ran)
	}
	if len(during) != len(before)+1 {
		t.Errorf("socket directories during the setup %v, before %v: want one more", during, before)
	}
	if after := socks(); len(after) != len(before) {
		t.Errorf("socket directories after the setup %v, before %v: left behind", after, before)
	}
	cli := newClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := cli.Get(ctx, "set-up")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "yes" {
		t.Fatalf("after the setup: %v, want set-up=yes", got.Kvs)
	}
	e.Stop()

	_, err = StartEmbedded(dir, EmbeddedOptions{ClientPort: port, UnsafeNoFsync: true, Logger: zap.NewNop(),
		Setup: func(context.Context, *clientv3.Client, bool) error { return errors.New("no roles today") }})
	if err == nil || !strings.Contains(err.Error(), "no roles today") {
		t.Fatalf("a failing setup: start returned %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s serves after a failed setup", addr)
	}
}
