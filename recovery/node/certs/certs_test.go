package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func creds(t *testing.T, ca *CA, id Identity, o IssueOptions) *TLS {
	t.Helper()
	c, err := ca.Credentials(id, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestIdentityInCertificate(t *testing.T) {
	ca := newCA(t)
	for _, id := range []Identity{NodeID(3), NodeID(1023), ClientID("loader"), ClientID("a.b-c_d")} {
		c := creds(t, ca, id, IssueOptions{})
		if c.Identity() != id {
			t.Errorf("issued %v, read back %v", id, c.Identity())
		}
		if got := c.leaf.Subject.CommonName; got != id.String() {
			t.Errorf("%v: CommonName %q", id, got)
		}
		if n, ok := id.NodeNumber(); ok != (id.Role == RoleNode) || (ok && "n"+itoa(n) != id.Name) {
			t.Errorf("%v: NodeNumber %d %v", id, n, ok)
		}
	}
}

func itoa(n int) string { return NodeID(n).Name[1:] }

func TestBadIdentitiesRefused(t *testing.T) {
	ca := newCA(t)
	for _, id := range []Identity{
		NodeID(0), NodeID(1024), {Role: RoleNode, Name: "n03"}, {Role: RoleNode, Name: "x3"},
		ClientID(""), ClientID("a/b"), ClientID("-x"), ClientID(strings.Repeat("a", 65)),
		{Role: "admin", Name: "x"},
	} {
		if _, err := ca.Issue(id, IssueOptions{}); !errors.Is(err, ErrIdentity) {
			t.Errorf("issue %q: %v, want ErrIdentity", id, err)
		}
	}
	if _, err := ca.Issue(ClientID("c"), IssueOptions{Hosts: []string{"localhost"}}); err == nil {
		t.Error("a client certificate with hosts was issued")
	}
}

// TestKeysSyncedApart (issue 24, point 7): the CA's key is written
// outside the certificates directory, and every file and directory
// written is synced before the call returns.
func TestKeysSyncedApart(t *testing.T) {
	var got []string
	synced = func(p string) { got = append(got, p) }
	defer func() { synced = nil }()
	dir := filepath.Join(t.TempDir(), "certs")
	if _, err := CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, CAKeyFile)); err == nil {
		t.Fatalf("ca.key written into %s", dir)
	}
	if same := filepath.Join(t.TempDir(), "x"); func() error { _, err := CreateCAAt(same, same+"/.", time.Hour); return err }() == nil {
		t.Fatal("a CA key written into its certificates directory")
	}
	cf, kf, err := Create(dir, NodeID(1), IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{filepath.Join(dir, CACertFile), filepath.Join(CADir(dir), CAKeyFile), CADir(dir), cf, kf, dir} {
		if !slices.Contains(got, want) {
			t.Errorf("%s not synced (synced: %v)", want, got)
		}
	}
}

func TestFilesRoundTripAndNoOverwrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if _, err := CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateCA(dir, time.Hour); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("second create-ca: %v, want an error that the files exist", err)
	}
	cf, kf, err := Create(dir, NodeID(3), IssueOptions{Hosts: []string{"127.0.0.1", "node3.example"}})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(cf) != "node.n3.crt" || filepath.Base(kf) != "node.n3.key" {
		t.Fatalf("files %s %s", cf, kf)
	}
	for _, p := range []string{kf, filepath.Join(CADir(dir), CAKeyFile)} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", p, st.Mode().Perm())
		}
	}
	if _, _, err := Create(dir, NodeID(3), IssueOptions{}); err == nil {
		t.Fatal("create-node 3 twice overwrote the first")
	}
	if _, _, err := Create(dir, ClientID("loader"), IssueOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(dir, NodeID(3))
	if err != nil {
		t.Fatal(err)
	}
	if c.Identity() != NodeID(3) || len(c.leaf.IPAddresses) != 1 || len(c.leaf.DNSNames) != 1 {
		t.Fatalf("loaded %v ips %v dns %v", c.Identity(), c.leaf.IPAddresses, c.leaf.DNSNames)
	}
	if _, err := Load(dir, NodeID(4)); err == nil || !strings.Contains(err.Error(), "create-node") {
		t.Fatalf("load a missing node: %v", err)
	}
	// A certificate renamed to another node's file is not that node's.
	c4, k4 := Files(dir, NodeID(4))
	copyFile(t, cf, c4)
	copyFile(t, kf, k4)
	if _, err := Load(dir, NodeID(4)); !errors.Is(err, ErrIdentity) {
		t.Fatalf("load n3's certificate as n4: %v, want ErrIdentity", err)
	}
	// A certificate of another CA is refused at load.
	other := t.TempDir()
	if _, err := CreateCA(other, time.Hour); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(other, CACertFile), filepath.Join(dir, "other.crt"))
	otherCA, _ := os.ReadFile(filepath.Join(other, CACertFile))
	cb, _ := os.ReadFile(cf)
	kb, _ := os.ReadFile(kf)
	if _, err := New(otherCA, cb, kb); err == nil || !strings.Contains(err.Error(), "not issued by this CA") {
		t.Fatalf("credentials with another CA: %v", err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// handshake runs one TLS handshake on loopback between a server with srv
// and a dialler with cli, and returns the identity the server saw and
// both ends' errors.
func handshake(t *testing.T, srv, cli *tls.Config) (peer Identity, serverErr, dialErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		nc, err := ln.Accept()
		if err != nil {
			serverErr = err
			return
		}
		defer nc.Close()
		tc := tls.Server(nc, srv)
		if serverErr = tc.HandshakeContext(ctx); serverErr == nil {
			peer, serverErr = PeerOf(tc.ConnectionState())
			_, _ = tc.Write([]byte{1})
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(nc, cli)
	dialErr = tc.HandshakeContext(ctx)
	if dialErr == nil {
		// In TLS 1.3 the server judges the client's certificate after the
		// client's handshake is done: its verdict comes with the first read.
		_ = tc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, dialErr = tc.Read(make([]byte, 1))
	}
	tc.Close()
	wg.Wait()
	return peer, serverErr, dialErr
}

func TestHandshakes(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	n1 := creds(t, ca, NodeID(1), IssueOptions{})
	n2 := creds(t, ca, NodeID(2), IssueOptions{})
	cl := creds(t, ca, ClientID("loader"), IssueOptions{})
	foreign := creds(t, other, NodeID(1), IssueOptions{})
	expired := creds(t, ca, NodeID(1), IssueOptions{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	noCert := n1.DialConfig("n2")
	noCert.Certificates = nil
	// Diallers that trust any server: the refusal is the server's.
	foreignDial := foreign.DialConfig("")
	foreignDial.VerifyConnection = nil
	expiredDial := expired.DialConfig("")
	expiredDial.VerifyConnection = nil

	for _, tc := range []struct {
		name      string
		srv, cli  *tls.Config
		peer      Identity
		serverErr string // "" for none
		dialErr   string
	}{
		{name: "node to node", srv: n2.ServerConfig(), cli: n1.DialConfig("n2"), peer: NodeID(1)},
		{name: "client to any node", srv: n2.ServerConfig(), cli: cl.DialConfig(""), peer: ClientID("loader")},
		{name: "wrong node answers", srv: n2.ServerConfig(), cli: n1.DialConfig("n3"), serverErr: "bad certificate", dialErr: "is node:n2, not node n3"},
		{name: "client cert serving", srv: cl.ServerConfig(), cli: n1.DialConfig(""), serverErr: "bad certificate", dialErr: "certificate specifies an incompatible key usage"},
		{name: "no client cert", srv: n2.ServerConfig(), cli: noCert, serverErr: "didn't provide a certificate", dialErr: "certificate required"},
		{name: "dialler of another CA", srv: n2.ServerConfig(), cli: foreignDial, serverErr: "certificate signed by unknown authority", dialErr: "remote error: tls: unknown certificate authority"},
		{name: "server of another CA", srv: foreign.ServerConfig(), cli: n2.DialConfig("n1"), serverErr: "bad certificate", dialErr: "certificate signed by unknown authority"},
		{name: "expired dialler", srv: n2.ServerConfig(), cli: expiredDial, serverErr: "expired", dialErr: "remote error: tls: expired certificate"},
		{name: "expired server", srv: expired.ServerConfig(), cli: n2.DialConfig("n1"), serverErr: "bad certificate", dialErr: "expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer, serr, derr := handshake(t, tc.srv, tc.cli)
			check := func(end string, err error, want string) {
				switch {
				case want == "" && err != nil:
					t.Errorf("%s: %v", end, err)
				case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
					t.Errorf("%s: %v, want an error with %q", end, err, want)
				}
			}
			check("server", serr, tc.serverErr)
			check("dialler", derr, tc.dialErr)
			if tc.serverErr == "" && peer != tc.peer {
				t.Errorf("server saw %v, want %v", peer, tc.peer)
			}
		})
	}
}

// TestEtcdCertificate: etcd's server certificate, issued by the cluster
// CA, serves an etcd client that checks the host name, and a node or
// client certificate from that CA passes etcd's client-certificate auth;
// it carries no identity, so it is no node's or client's credentials and
// a node refuses it as a dialler.
func TestEtcdCertificate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	ca, err := CreateCA(dir, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.IssueEtcd(IssueOptions{}); err == nil || !strings.Contains(err.Error(), "needs the hosts") {
		t.Fatalf("etcd certificate without hosts: %v", err)
	}
	cf, kf, err := CreateEtcd(dir, IssueOptions{Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := CreateEtcd(dir, IssueOptions{Hosts: []string{"127.0.0.1"}}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("second etcd certificate: %v, want an error that the files exist", err)
	}
	if wc, wk := EtcdFiles(dir); cf != wc || kf != wk {
		t.Fatalf("written to %s %s, EtcdFiles says %s %s", cf, kf, wc, wk)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := os.ReadFile(cf)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(kf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(caPEM, certPEM, keyPEM); !errors.Is(err, ErrIdentity) {
		t.Fatalf("etcd's certificate as credentials: %v, want ErrIdentity", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	// etcd's own server config: its certificate, client certificates from
	// the CA required (what etcd's --client-cert-auth sets).
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	etcdSrv := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	n1 := creds(t, ca, NodeID(1), IssueOptions{})
	cl := creds(t, ca, ClientID("demo"), IssueOptions{})
	foreign := creds(t, newCA(t), ClientID("demo"), IssueOptions{})
	// Trusts etcd (the CA's roots), holds another CA's certificate.
	foreignCli := withHost(cl.EtcdClientConfig(), "127.0.0.1")
	foreignCli.Certificates = foreign.EtcdClientConfig().Certificates
	wrongHost := cl.EtcdClientConfig()
	wrongHost.ServerName = "etcd.example"
	etcdAsDialler := n1.DialConfig("")
	etcdAsDialler.Certificates = []tls.Certificate{pair}
	for _, tc := range []struct {
		name               string
		srv, cli           *tls.Config
		serverErr, dialErr string
	}{
		{name: "node to etcd", srv: etcdSrv, cli: withHost(n1.EtcdClientConfig(), "127.0.0.1")},
		{name: "client to etcd", srv: etcdSrv, cli: withHost(cl.EtcdClientConfig(), "localhost")},
		{name: "another CA's client to etcd", srv: etcdSrv, cli: foreignCli,
			serverErr: "certificate signed by unknown authority", dialErr: "remote error: tls: unknown certificate authority"},
		{name: "etcd at a host it does not name", srv: etcdSrv, cli: wrongHost, serverErr: "bad certificate", dialErr: "not etcd.example"},
		{name: "etcd's certificate dialling a node", srv: n1.ServerConfig(), cli: etcdAsDialler,
			serverErr: "no rejoin:// URI SAN", dialErr: "remote error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, serr, derr := handshake(t, tc.srv, tc.cli)
			for _, c := range []struct {
				end  string
				err  error
				want string
			}{{"server", serr, tc.serverErr}, {"dialler", derr, tc.dialErr}} {
				if (c.want == "") != (c.err == nil) || (c.err != nil && !strings.Contains(c.err.Error(), c.want)) {
					t.Errorf("%s: %v, want %q", c.end, c.err, c.want)
				}
			}
		})
	}
}

func withHost(c *tls.Config, host string) *tls.Config {
	c.ServerName = host
	return c
}
