package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

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
