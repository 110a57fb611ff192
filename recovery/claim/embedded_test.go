package claim

import (
	"context"
	"net"
	"testing"
	"time"

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
