package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

// TestCertCommands: `rejoin cert` writes a CA and a node's and a client's
// certificates that load back with their identities, refuses to
// overwrite, and says what is wrong with bad arguments.
func TestCertCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	for _, tt := range []struct {
		args     []string
		code     int
		stdoutIn string
		stderrIn string
	}{
		{args: []string{"cert"}, code: 2, stderrIn: "usage: rejoin cert"},
		{args: []string{"cert", "create-node", "3"}, code: 2, stderrIn: "--certs-dir is required"},
		{args: []string{"cert", "create-node", "3", "--certs-dir", dir}, code: 1, stderrIn: "rejoin cert create-ca"},
		{args: []string{"cert", "create-ca", "--certs-dir", dir}, code: 0, stdoutIn: "ca.key"},
		{args: []string{"cert", "create-ca", "--certs-dir", dir}, code: 1, stderrIn: "exists"},
		{args: []string{"cert", "create-node", "3", "--certs-dir", dir}, code: 0, stdoutIn: "node.n3.crt"},
		{args: []string{"cert", "create-node", "--certs-dir", dir, "4"}, code: 0, stdoutIn: "node.n4.crt"},
		{args: []string{"cert", "create-node", "3", "--certs-dir", dir}, code: 1, stderrIn: "exists"},
		{args: []string{"cert", "create-node", "0", "--certs-dir", dir}, code: 2, stderrIn: "node name \"n0\""},
		{args: []string{"cert", "create-node", "three", "--certs-dir", dir}, code: 2, stderrIn: "want the node's number"},
		{args: []string{"cert", "create-client", "loader", "--certs-dir", dir}, code: 0, stdoutIn: "client.loader.crt"},
		{args: []string{"cert", "create-client", "a/b", "--certs-dir", dir}, code: 2, stderrIn: "client name"},
		{args: []string{"cert", "create-client", "x", "y", "--certs-dir", dir}, code: 2, stderrIn: `unexpected argument "y"`},
		{args: []string{"cert", "create-user", "x", "--certs-dir", dir}, code: 2, stderrIn: `unknown action "create-user"`},
		{args: []string{"cert", "create-etcd", "--certs-dir", dir, "--host", "127.0.0.1"}, code: 0, stdoutIn: "etcd.crt"},
		{args: []string{"cert", "create-etcd", "--certs-dir", dir}, code: 1, stderrIn: "exists"},
		{args: []string{"cert", "create-etcd", "x", "--certs-dir", dir}, code: 2, stderrIn: `unexpected argument "x"`},
	} {
		var out, errOut bytes.Buffer
		code := run(tt.args, &out, &errOut)
		if code != tt.code || !strings.Contains(out.String(), tt.stdoutIn) || !strings.Contains(errOut.String(), tt.stderrIn) {
			t.Errorf("run(%q) = %d, stdout %q, stderr %q; want %d, %q in stdout, %q in stderr",
				tt.args, code, out.String(), errOut.String(), tt.code, tt.stdoutIn, tt.stderrIn)
		}
	}
	for _, id := range []certs.Identity{certs.NodeID(3), certs.NodeID(4), certs.ClientID("loader")} {
		c, err := certs.Load(dir, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.Identity() != id {
			t.Fatalf("loaded %v, want %v", c.Identity(), id)
		}
	}
}

// TestCertCAKeyKeptApart (issue 24, point 7): `rejoin cert create-ca`
// writes the CA's key outside the directory the nodes are given, which
// holds ca.crt only; the certificates are issued with the key from there
// (--ca-dir, default <certs-dir>-ca), and a node's directory holds no key
// but its own.
func TestCertCAKeyKeptApart(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "certs")
	for _, args := range [][]string{
		{"cert", "create-ca", "--certs-dir", dir},
		{"cert", "create-node", "1", "--certs-dir", dir},
		{"cert", "create-client", "root", "--certs-dir", dir},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 0 {
			t.Fatalf("run(%q) = %d: %s", args, code, errOut.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ca.key")); err == nil {
		t.Fatalf("create-ca wrote ca.key into %s, the directory every node is given", dir)
	}
	key := filepath.Join(root, "certs-ca", "ca.key")
	st, err := os.Stat(key)
	if err != nil {
		t.Fatalf("the CA's key: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s mode %v, want 0600", key, st.Mode().Perm())
	}
	if st, err := os.Stat(filepath.Dir(key)); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("the CA key's directory: %v %v, want mode 0700", st, err)
	}
	if _, err := certs.Load(dir, certs.NodeID(1)); err != nil {
		t.Fatal(err)
	}
	// Another place for the key, given to every command that issues.
	other, elsewhere := filepath.Join(root, "c2"), filepath.Join(root, "vault")
	for _, args := range [][]string{
		{"cert", "create-ca", "--certs-dir", other, "--ca-dir", elsewhere},
		{"cert", "create-node", "2", "--certs-dir", other, "--ca-dir", elsewhere},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 0 {
			t.Fatalf("run(%q) = %d: %s", args, code, errOut.String())
		}
	}
	if _, err := os.Stat(filepath.Join(elsewhere, "ca.key")); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"cert", "create-node", "3", "--certs-dir", other}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "--ca-dir") {
		t.Fatalf("create-node without the key's directory: %d %q, want an error naming --ca-dir", code, errOut.String())
	}
}

// TestEtcdFlags: the etcd TLS and auth flags make the client's config.
func TestEtcdFlags(t *testing.T) {
	dir := t.TempDir()
	if _, err := certs.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	cf, kf, err := certs.Create(dir, certs.NodeID(1), certs.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := newFlagSet("node", &bytes.Buffer{})
	f := newEtcdFlags(fs)
	if err := fs.Parse([]string{"--etcd", "https://a:2379,https://b:2379", "--etcd-cacert", filepath.Join(dir, certs.CACertFile),
		"--etcd-cert", cf, "--etcd-key", kf, "--etcd-user", "rejoin", "--etcd-password-file", pw}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Endpoints) != 2 || cfg.TLS == nil || cfg.TLS.RootCAs == nil || len(cfg.TLS.Certificates) != 1 ||
		cfg.Username != "rejoin" || cfg.Password != "s3cret" {
		t.Fatalf("etcd config: endpoints %v tls %v user %q password %q", cfg.Endpoints, cfg.TLS, cfg.Username, cfg.Password)
	}
}
