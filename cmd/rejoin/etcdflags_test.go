package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// etcdCertsDir is a certificates directory with a CA, node n2's and
// client root's certificates.
func etcdCertsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := certs.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	for _, id := range []certs.Identity{certs.NodeID(2), certs.ClientID("root"), certs.ClientID(appClient)} {
		if _, _, err := certs.Create(dir, id, certs.IssueOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// etcdClientIdentity is whose certificate an etcd client config presents.
func etcdClientIdentity(t *testing.T, c *tls.Config) certs.Identity {
	t.Helper()
	if c == nil {
		t.Fatal("no etcd TLS config: want a CA and one client certificate")
	}
	if c.RootCAs == nil || len(c.Certificates) != 1 {
		t.Fatalf("etcd TLS config with a CA %v and %d certificates: want a CA and one client certificate", c.RootCAs != nil, len(c.Certificates))
	}
	leaf, err := x509.ParseCertificate(c.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	id, err := certs.IdentityOf(leaf)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestEtcdCertsDirDefault: with --certs-dir and an https etcd, a node's
// etcd client uses the directory's CA and the node's certificate, a
// client command's the directory's CA and the --client certificate; with
// an http etcd, no TLS.
func TestEtcdCertsDirDefault(t *testing.T) {
	dir := etcdCertsDir(t)
	nfs := newFlagSet("node", &bytes.Buffer{})
	nf := newNodeFlags(nfs)
	if err := nfs.Parse([]string{"--id", "2", "--etcd", "https://127.0.0.1:2379", "--data", t.TempDir(), "--certs-dir", dir}); err != nil {
		t.Fatal(err)
	}
	cfg, err := nf.config(&bytes.Buffer{})
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	if id := etcdClientIdentity(t, cfg.EtcdTLS); id != certs.NodeID(2) {
		t.Fatalf("node n2's etcd client presents %s", id)
	}

	fs := newFlagSet("get", &bytes.Buffer{})
	sf := newShellFlags(fs, "get")
	if err := fs.Parse([]string{"--etcd", "https://127.0.0.1:2379", "--certs-dir", dir}); err != nil {
		t.Fatal(err)
	}
	ec, err := sf.etcd.config()
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if id := etcdClientIdentity(t, ec.TLS); id != certs.ClientID(appClient) {
		t.Fatalf("the shell's etcd client presents %s, want the client commands' %s, not the admin's", id, certs.ClientID(appClient))
	}
	// An admin command's is the admin's.
	fs = newFlagSet("access", &bytes.Buffer{})
	adm := newEtcdFlags(fs)
	newClientCertsFlags(fs, adm, etcdCertsDirUsage, supervise.AdminClient)
	if err := fs.Parse([]string{"--etcd", "https://127.0.0.1:2379", "--certs-dir", dir}); err != nil {
		t.Fatal(err)
	}
	if ec, err = adm.config(); err != nil {
		t.Fatal(err)
	}
	if id := etcdClientIdentity(t, ec.TLS); id != certs.ClientID(supervise.AdminClient) {
		t.Fatalf("an admin command's etcd client presents %s", id)
	}

	fs = newFlagSet("get", &bytes.Buffer{})
	sf = newShellFlags(fs, "get")
	if err := fs.Parse([]string{"--etcd", "http://127.0.0.1:2379", "--certs-dir", dir}); err != nil {
		t.Fatal(err)
	}
	if ec, err := sf.etcd.config(); err != nil || ec.TLS != nil {
		t.Fatalf("an http etcd with --certs-dir: TLS %v, err %v; want plain", ec.TLS, err)
	}
}

// TestEtcdCertsDirOverride: an --etcd-* flag wins over --certs-dir's
// file, and only that one: the others still come from the directory.
func TestEtcdCertsDirOverride(t *testing.T) {
	dir := etcdCertsDir(t)
	cf, kf, err := certs.Create(dir, certs.ClientID("ops"), certs.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (*tls.Config, error) {
		fs := newFlagSet("get", &bytes.Buffer{})
		sf := newShellFlags(fs, "get")
		if err := fs.Parse(append([]string{"--etcd", "https://127.0.0.1:2379", "--certs-dir", dir}, args...)); err != nil {
			t.Fatal(err)
		}
		ec, err := sf.etcd.config()
		return ec.TLS, err
	}
	c, err := run("--etcd-cert", cf, "--etcd-key", kf)
	if err != nil {
		t.Fatal(err)
	}
	if id := etcdClientIdentity(t, c); id != certs.ClientID("ops") {
		t.Fatalf("--etcd-cert of ops: the etcd client presents %s", id)
	}
	// An explicit CA of another cluster, and the certificate from the
	// directory.
	other := t.TempDir()
	if _, err := certs.CreateCA(other, time.Hour); err != nil {
		t.Fatal(err)
	}
	c, err = run("--etcd-cacert", filepath.Join(other, certs.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if id := etcdClientIdentity(t, c); id != certs.ClientID(appClient) {
		t.Fatalf("--etcd-cacert alone: the etcd client presents %s, want the directory's client app", id)
	}
	ours, err := os.ReadFile(filepath.Join(dir, certs.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ours)
	if c.RootCAs.Equal(pool) {
		t.Fatal("--etcd-cacert of another CA: the etcd client trusts --certs-dir's ca.crt")
	}
	if _, err := run("--etcd-cert", cf); err == nil || !strings.Contains(err.Error(), "--etcd-cert and --etcd-key go together") {
		t.Fatalf("--etcd-cert without --etcd-key: %v", err)
	}
}

// TestEtcdCertsDirMissingFile: an https etcd and a certificates
// directory without a file the etcd client needs is an error naming the
// file, for a node and for each command that reaches etcd.
func TestEtcdCertsDirMissingFile(t *testing.T) {
	dir := etcdCertsDir(t)
	nfs := newFlagSet("node", &bytes.Buffer{})
	nf := newNodeFlags(nfs)
	if err := nfs.Parse([]string{"--id", "3", "--etcd", "https://127.0.0.1:2379", "--data", t.TempDir(), "--certs-dir", dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := nf.config(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "node.n3.crt")) {
		t.Fatalf("node n3 without its certificate: %v; want an error naming %s", err, filepath.Join(dir, "node.n3.crt"))
	}
	noCA := t.TempDir()
	for _, f := range []string{"client.root.crt", "client.root.key"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(noCA, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	etcd := []string{"--etcd", "https://127.0.0.1:1", "--timeout", "1s"}
	for _, c := range []struct {
		name string
		run  func([]string, *bytes.Buffer, *bytes.Buffer) error
		args []string
	}{
		{"init", func(a []string, o, e *bytes.Buffer) error { return runInit(a, o, e) }, nil},
		{"status", func(a []string, o, e *bytes.Buffer) error { return runStatus(a, o, e) }, nil},
		{"replace", func(a []string, o, e *bytes.Buffer) error { return runReplace(a, o, e) }, []string{"--dead", "n2", "--with", "n4"}},
		{"rebalance", func(a []string, o, e *bytes.Buffer) error { return runRebalance(a, o, e) }, nil},
		{"drain", func(a []string, o, e *bytes.Buffer) error { return runDrain(a, o, e) }, []string{"n1"}},
		{"verify", func(a []string, o, e *bytes.Buffer) error { return runVerify(a, o, e) }, nil},
		{"load", func(a []string, o, e *bytes.Buffer) error { return runLoad(a, o, e) }, nil},
		{"get", func(a []string, o, e *bytes.Buffer) error { return runGet(append(a, "k"), o, e) }, nil},
	} {
		for _, m := range []struct{ dir, args, file string }{
			{dir, "--client ops", filepath.Join(dir, "client.ops.crt")},
			{noCA, "", filepath.Join(noCA, certs.CACertFile)},
		} {
			args := append(append(append([]string{}, etcd...), "--certs-dir", m.dir), strings.Fields(m.args)...)
			args = append(args, c.args...)
			var out, errOut bytes.Buffer
			err := c.run(args, &out, &errOut)
			if !errors.Is(err, errUsage) || !strings.Contains(errOut.String(), m.file) {
				t.Errorf("rejoin %s %q: %v, stderr %q; want a usage error naming %s", c.name, args, err, errOut.String(), m.file)
			}
		}
	}
}

// TestEnvDefaults: $REJOIN_ETCD, $REJOIN_CERTS_DIR and $REJOIN_CLIENT
// stand for --etcd, --certs-dir and --client; a flag given wins, and
// --insecure given wins over $REJOIN_CERTS_DIR.
func TestEnvDefaults(t *testing.T) {
	dir := etcdCertsDir(t)
	t.Setenv(envEtcd, "https://127.0.0.1:1")
	t.Setenv(envCertsDir, dir)
	t.Setenv(envClient, "alice")
	parse := func(args ...string) (*etcdFlags, *clientTLSFlags) {
		fs := newFlagSet("verify", &bytes.Buffer{})
		ef := newEtcdFlags(fs)
		tf := newClientTLSFlags(fs, ef)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return ef, tf
	}
	ef, tf := parse()
	if ef.endpoints != "https://127.0.0.1:1" || tf.certsDir != dir || tf.name != "alice" {
		t.Fatalf("from the environment: --etcd %q, --certs-dir %q, --client %q", ef.endpoints, tf.certsDir, tf.name)
	}
	ef, tf = parse("--etcd", "https://127.0.0.1:2", "--certs-dir", "/elsewhere", "--client", "bob")
	if ef.endpoints != "https://127.0.0.1:2" || tf.certsDir != "/elsewhere" || tf.name != "bob" {
		t.Fatalf("flags given: --etcd %q, --certs-dir %q, --client %q", ef.endpoints, tf.certsDir, tf.name)
	}
	_, tf = parse("--insecure")
	if creds, err := tf.load(); creds != nil || err != nil {
		t.Fatalf("--insecure with $REJOIN_CERTS_DIR set: %v, %v; want no credentials, no error", creds, err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"node", "--data", t.TempDir()}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "--id is required") {
		t.Fatalf("node without --id, its certificates from $REJOIN_CERTS_DIR: exit %d, stderr %q", code, errOut.String())
	}
}
