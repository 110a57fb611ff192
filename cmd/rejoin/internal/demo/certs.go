package demo

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

// ClientName is the demo's client certificate's name (its loader, its
// writer and its checks).
const ClientName = "demo"

// certsLifetime bounds what the demo issues: a demo lasts minutes, a kept
// one a working day or so.
const certsLifetime = 7 * 24 * time.Hour

// EnsureCerts makes dir's cluster CA and the certificates of nodes
// 1..nodes and of the demo's client, those not there yet (a --dir reused
// keeps its CA), and returns the client's credentials.
func EnsureCerts(dir string, nodes int) (*certs.TLS, error) {
	if _, err := os.Stat(filepath.Join(dir, certs.CACertFile)); errors.Is(err, fs.ErrNotExist) {
		if _, err := certs.CreateCA(dir, certsLifetime); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	ids := []certs.Identity{certs.ClientID(ClientName)}
	for id := 1; id <= nodes; id++ {
		ids = append(ids, certs.NodeID(id))
	}
	o := certs.IssueOptions{NotAfter: time.Now().Add(certsLifetime), Hosts: []string{"localhost", "127.0.0.1", "::1"}}
	for _, id := range ids {
		cf, _ := certs.Files(dir, id)
		if _, err := os.Stat(cf); err == nil {
			continue
		}
		opt := o
		if id.Role == certs.RoleClient {
			opt.Hosts = nil
		}
		if _, _, err := certs.Create(dir, id, opt); err != nil {
			return nil, err
		}
	}
	return certs.Load(dir, certs.ClientID(ClientName))
}
