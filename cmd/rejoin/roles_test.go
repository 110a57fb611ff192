package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// TestEtcdRolesEndToEnd (issue 24, point 3): the cluster's own etcd
// (`rejoin etcd --certs-dir`) runs with etcd's authentication and the
// roles on, and a cluster of node processes works under them, while a
// node's certificate may not write another node's incarnation nor the
// cluster's config, a client's may read but not write, a certificate
// with no etcd user may do nothing, and a node with no user is told how
// to get one.
func TestEtcdRolesEndToEnd(t *testing.T) {
	bin := rejoinBinary(t)
	w := newRolesWalk(t, bin)
	defer checkNoNodes(t)
	defer w.stopAll()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w.ctx = ctx
	dir := filepath.Join(w.dir, "certs")
	for _, c := range [][]string{{"create-ca"}, {"create-etcd"}, {"create-node", "1"}, {"create-node", "2"}, {"create-node", "3"},
		{"create-client", "root"}, {"create-client", "scraper"}, {"create-client", "app"}} {
		w.run(append(append([]string{"cert"}, c...), "--certs-dir", dir)...)
	}
	w.startEtcd([]string{"etcd", "--data", filepath.Join(w.dir, "etcd"), "--port", "0", "--certs-dir", dir})
	e := []string{"--etcd", w.etcd, "--certs-dir", dir}
	w.run(append([]string{"init", "--partitions", "2", "--replicas", "2", "--nodes", "2"}, e...)...)
	for _, id := range []string{"1", "2"} {
		w.startNode("N"+id, append([]string{"node", "--id", id, "--data", filepath.Join(w.dir, "n"+id)}, e...), filepath.Join(w.dir, "n"+id+".log"), false)
	}
	if out := w.run(append([]string{"put"}, append(e, "hello", "world")...)...); strings.TrimSpace(out) != "OK" {
		t.Fatalf("put: %q", out)
	}

	as := func(id certs.Identity) *clientv3.Client { return etcdAs(t, dir, w.etcd, id) }
	denied := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s: %v, want etcd's permission denied", what, err)
		}
	}
	n1 := as(certs.NodeID(1))
	_, err := n1.Put(ctx, supervise.IncarnationKey("n2"), `{"count":1}`)
	denied("n1's certificate writes n2's incarnation", err)
	_, err = n1.Put(ctx, "/rejoin/cluster", "{}")
	denied("n1's certificate writes the cluster's config", err)
	scraper := as(certs.ClientID("scraper"))
	_, err = scraper.Get(ctx, "/rejoin/cluster")
	denied("a client certificate without an etcd user reads", err)

	w.run(append([]string{"access", "--reader", "scraper"}, e...)...)
	if _, err := scraper.Get(ctx, "/rejoin/cluster"); err != nil {
		t.Errorf("a reader reads the config: %v", err)
	}
	_, err = scraper.Put(ctx, "/rejoin/cluster", "{}")
	denied("a reader writes the config", err)
	_, err = scraper.Delete(ctx, supervise.NodeKey("n1"))
	denied("a reader deletes n1's registration", err)
	w.run(append([]string{"status", "--client", "scraper"}, e...)...)
	// An admin's command with a reader's certificate says whose it is.
	var errOut strings.Builder
	c := exec.CommandContext(ctx, bin, append([]string{"replace", "--dead", "n3", "--with", "n4", "--wait", "0", "--client", "scraper"}, e...)...)
	c.Stderr = &errOut
	if err := c.Run(); err == nil || !strings.Contains(errOut.String(), "etcd user client:scraper") {
		t.Errorf("replace as a reader: %v, stderr %q; want a refusal naming the user", err, errOut.String())
	}
	if out := w.run(append([]string{"get"}, append(e, "hello")...)...); strings.TrimSpace(out) != "world" {
		t.Fatalf("get: %q", out)
	}
	// The client commands run as app, a reader that init gave its user,
	// not as the admin: with a directory holding app's certificate and no
	// admin's, they work; app's certificate writes nothing in etcd.
	appDir := filepath.Join(w.dir, "app-certs")
	if err := os.MkdirAll(appDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{certs.CACertFile, "client.app.crt", "client.app.key"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(appDir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ea := []string{"--etcd", w.etcd, "--certs-dir", appDir}
	if out := w.run(append([]string{"put"}, append(ea, "hello", "app")...)...); strings.TrimSpace(out) != "OK" {
		t.Fatalf("put as app: %q", out)
	}
	w.run(append([]string{"status"}, ea...)...)
	app := as(certs.ClientID("app"))
	_, err = app.Put(ctx, "/rejoin/cluster", "{}")
	denied("app's certificate writes the config", err)
	c = exec.CommandContext(ctx, bin, append([]string{"access", "--reader", "x"}, ea...)...)
	errOut.Reset()
	c.Stderr = &errOut
	if err := c.Run(); err == nil || !strings.Contains(errOut.String(), "client.root") {
		t.Errorf("access with no admin's certificate: %v, stderr %q; want it to look for client.root's", err, errOut.String())
	}

	// n3 was never given its etcd user.
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	defer ncancel()
	c = exec.CommandContext(nctx, bin, append([]string{"node", "--id", "3", "--data", filepath.Join(w.dir, "n3")}, e...)...)
	out, err := c.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "rejoin access --node 3") {
		t.Fatalf("n3 without an etcd user: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "ca.key")); err == nil {
		t.Error("the CA's key is in the certificates directory")
	}
}

// TestEtcdServesOnlyOnceAuthIsOn: a new `rejoin etcd --certs-dir` turns
// etcd's authentication on before its port takes a connection. A
// certificate of the cluster's CA with no etcd user (a scraper's) tries
// to write the cluster's config from before the process starts until it
// is ready: every try fails, and the config is not there. Before, the
// port served while the process set its roles up, and any certificate of
// the CA could write what it liked then.
func TestEtcdServesOnlyOnceAuthIsOn(t *testing.T) {
	bin := rejoinBinary(t)
	w := newRolesWalk(t, bin)
	defer w.stopAll()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w.ctx = ctx
	dir := filepath.Join(w.dir, "certs")
	for _, c := range [][]string{{"create-ca"}, {"create-etcd"}, {"create-client", "root"}, {"create-client", "scraper"}} {
		w.run(append(append([]string{"cert"}, c...), "--certs-dir", dir)...)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ep := fmt.Sprintf("https://127.0.0.1:%d", port)
	scraperCreds, err := certs.Load(dir, certs.ClientID("scraper"))
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	tries := make(chan [2]int, 1)
	go func() {
		// A client dialled the moment the port answers: gRPC's redial
		// backoff after refused connections would come too late.
		n, wrote := 0, 0
		defer func() { tries <- [2]int{n, wrote} }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 100*time.Millisecond)
			if err != nil {
				time.Sleep(time.Millisecond)
				continue
			}
			c.Close()
			scraper, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: time.Second, Logger: zap.NewNop(), TLS: scraperCreds.EtcdClientConfig()})
			if err != nil {
				continue
			}
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			_, err = scraper.Put(pctx, "/rejoin/cluster", "written before auth")
			pcancel()
			scraper.Close()
			n++
			if err == nil {
				wrote++
			}
		}
	}()
	w.startEtcd([]string{"etcd", "--data", filepath.Join(w.dir, "etcd"), "--port", strconv.Itoa(port), "--certs-dir", dir})
	time.Sleep(500 * time.Millisecond)
	close(stop)
	got := <-tries
	if got[1] > 0 || got[0] < 2 {
		t.Fatalf("%d of %d writes with a certificate of no etcd user succeeded while etcd started, want none of at least 2", got[1], got[0])
	}
	resp, err := etcdAs(t, dir, ep, certs.ClientID(supervise.AdminClient)).Get(ctx, "/rejoin/cluster")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("the cluster's config %q was written while etcd started", resp.Kvs[0].Value)
	}
}

// newRolesWalk is a walk of the etcd roles' tests, run with bin.
func newRolesWalk(t *testing.T, bin string) *walk {
	return &walk{t: t, bin: bin, dir: t.TempDir(), vars: map[string]string{}, procs: map[string]*exec.Cmd{}, ids: map[string]string{}}
}

// etcdAs is an etcd client of endpoint with the certificate of id from
// the certificates directory dir, closed when the test ends.
func etcdAs(t *testing.T, dir, endpoint string, id certs.Identity) *clientv3.Client {
	t.Helper()
	c, err := certs.Load(dir, id)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: c.EtcdClientConfig()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
