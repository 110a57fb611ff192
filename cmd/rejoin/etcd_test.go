package main

import (
	"bytes"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/demo"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

// TestEmbeddedEtcdRequiresClientCertificate: the demo's embedded etcd
// (its TLS from the demo's certificates) serves https only and answers
// only a client with a certificate from the demo's CA. A client without
// one, with one from another CA, or over plain http fails within its
// --timeout, saying why; with the demo's client certificate the same
// command reaches etcd.
func TestEmbeddedEtcdRequiresClientCertificate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	creds, err := demo.EnsureCerts(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if _, err := demo.EnsureCerts(other, 1); err != nil {
		t.Fatal(err)
	}
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true, TLS: demo.EmbeddedEtcdTLS(dir, creds)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	ep := strings.Join(e.Endpoints(), ",")
	if !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("endpoints %s, want https on loopback", ep)
	}
	ca := filepath.Join(dir, certs.CACertFile)
	otherCert, otherKey := certs.Files(other, certs.ClientID(demo.ClientName))
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name  string
		flags []string
		code  int
		want  string
	}{
		{"no client certificate", []string{"--etcd", ep, "--etcd-cacert", ca}, 1, "certificate required"},
		{"another CA's client certificate", []string{"--etcd", ep, "--etcd-cacert", ca, "--etcd-cert", otherCert, "--etcd-key", otherKey}, 1, "unknown certificate authority"},
		{"plain http", []string{"--etcd", strings.Replace(ep, "https://", "http://", 1)}, 1, "serves TLS: use https://"},
		{"the demo's client certificate", append([]string{"--etcd", ep}, demo.EtcdTLSFlags(dir, certs.ClientID(demo.ClientName))...), 1, "holds no cluster"},
		{"a node's certificate", append([]string{"--etcd", ep}, demo.EtcdTLSFlags(dir, certs.NodeID(1))...), 1, "holds no cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			start := time.Now()
			code := run(append([]string{"status", "--timeout", timeout.String()}, tc.flags...), &out, &errOut)
			if took := time.Since(start); took > timeout+5*time.Second {
				t.Errorf("took %s with --timeout %s", took, timeout)
			}
			t.Logf("exit %d after %s: %s", code, time.Since(start).Round(time.Millisecond), strings.TrimSpace(errOut.String()))
			if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errOut.String(), tc.code, tc.want)
			}
		})
	}
	// The shell client too: refused without a certificate (no
	// --certs-dir to take one from), through with the demo's, named or
	// taken from --certs-dir.
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"get without a client certificate", []string{"--insecure", "--etcd", ep, "--etcd-cacert", ca}, "refused this client's certificate (--etcd-cert): remote error: tls: certificate required"},
		{"get with the demo's certificate", append([]string{"--certs-dir", dir, "--client", demo.ClientName, "--etcd", ep}, demo.EtcdTLSFlags(dir, certs.ClientID(demo.ClientName))...), "holds no cluster"},
		{"get with --certs-dir's certificate", []string{"--certs-dir", dir, "--client", demo.ClientName, "--etcd", ep}, "holds no cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			start := time.Now()
			args := append(append([]string{"get", "--timeout", timeout.String()}, tc.flags...), "k")
			code := run(args, &out, &errOut)
			t.Logf("exit %d after %s: %s", code, time.Since(start).Round(time.Millisecond), strings.TrimSpace(errOut.String()))
			if took := time.Since(start); took > timeout+5*time.Second {
				t.Errorf("took %s with --timeout %s", took, timeout)
			}
			if code == 0 || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want a failure with %q", code, errOut.String(), tc.want)
			}
		})
	}
	// A node with another CA's certificate exits within --etcd-timeout,
	// saying why.
	t.Run("node with another CA's certificate", func(t *testing.T) {
		var out, errOut bytes.Buffer
		start := time.Now()
		code := run([]string{"node", "--id", "1", "--etcd", ep, "--data", t.TempDir(), "--certs-dir", dir, "--etcd-timeout", timeout.String(),
			"--etcd-cacert", ca, "--etcd-cert", otherCert, "--etcd-key", otherKey}, &out, &errOut)
		took := time.Since(start)
		t.Logf("exit %d after %s: %s", code, took.Round(time.Millisecond), strings.TrimSpace(errOut.String()))
		if took > timeout+5*time.Second {
			t.Errorf("took %s with --etcd-timeout %s", took, timeout)
		}
		if code != 1 || !strings.Contains(errOut.String(), "refused this client's certificate (--etcd-cert): remote error: tls: unknown certificate authority") {
			t.Errorf("exit %d, stderr %q", code, errOut.String())
		}
	})
}

// TestEtcdRefusalsFailFast: an etcd endpoint that refuses the connection,
// one whose server is TLS though the endpoint has no scheme, and an etcd
// that refuses a certificate of another CA are each reported with their
// cause before any wait, by status, get, init and node alike: never as
// "did not answer" after --timeout (they used to wait it out, 5, 10 and
// 30 s by default, and then name no cause for the first two; a node its
// --etcd-timeout, 1m here).
func TestEtcdRefusalsFailFast(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	creds, err := demo.EnsureCerts(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	if _, err := demo.EnsureCerts(other, 1); err != nil {
		t.Fatal(err)
	}
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true, TLS: demo.EmbeddedEtcdTLS(dir, creds)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	ep := e.Endpoints()[0]
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	otherCert, otherKey := certs.Files(other, certs.ClientID(demo.ClientName))
	otherCA := []string{"--etcd-cacert", filepath.Join(dir, certs.CACertFile), "--etcd-cert", otherCert, "--etcd-key", otherKey}
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"closed port", []string{"--etcd", closed}, "connect: connection refused"},
		{"no scheme", []string{"--etcd", strings.TrimPrefix(ep, "https://")}, "has no scheme, and etcd there serves TLS: write https://"},
		{"another CA's certificate", append([]string{"--etcd", ep}, otherCA...), "refused this client's certificate (--etcd-cert): remote error: tls: unknown certificate authority"},
		{"no port", []string{"--etcd", "127.0.0.1"}, `etcd endpoint "127.0.0.1" names no port: write it as https://HOST:PORT`},
	} {
		for _, cmd := range [][]string{
			{"status", "--timeout", "1m"},
			{"get", "--timeout", "1m", "--insecure", "k"},
			{"init", "--timeout", "1m", "--partitions", "2", "--replicas", "1", "--nodes", "1"},
			{"node", "--etcd-timeout", "1m", "--id", "1", "--data", t.TempDir(), "--insecure"},
		} {
			t.Run(tc.name+"/"+cmd[0], func(t *testing.T) {
				args := append([]string{cmd[0]}, tc.flags...)
				args = append(args, cmd[1:]...)
				var out, errOut bytes.Buffer
				code := run(args, &out, &errOut)
				t.Logf("exit %d: %s", code, strings.TrimSpace(errOut.String()))
				if code != 1 || !strings.Contains(errOut.String(), tc.want) || strings.Contains(errOut.String(), "did not answer") {
					t.Errorf("rejoin %q: exit %d, stderr %q; want exit 1 and %q at once", args, code, errOut.String(), tc.want)
				}
			})
		}
	}
}
