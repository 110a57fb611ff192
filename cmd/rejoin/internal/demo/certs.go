package demo

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
)

// ClientName is the demo's client certificate's name (its loader, its
// writer and its checks).
const ClientName = "demo"

// certsLifetime bounds what the demo issues: a demo lasts minutes, a kept
// one a working day or so.
const certsLifetime = 7 * 24 * time.Hour

// EnsureCerts makes dir's cluster CA, the certificates of nodes 1..nodes,
// of the demo's client and of the admin (client root), and etcd's server
// certificate, those not there yet (a --dir reused keeps its CA), and
// returns the demo client's credentials.
func EnsureCerts(dir string, nodes int) (*certs.TLS, error) {
	if _, err := os.Stat(filepath.Join(dir, certs.CACertFile)); errors.Is(err, fs.ErrNotExist) {
		if _, err := certs.CreateCA(dir, certsLifetime); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	ids := []certs.Identity{certs.ClientID(ClientName), certs.ClientID(supervise.AdminClient)}
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
	if cf, _ := certs.EtcdFiles(dir); fileMissing(cf) {
		if _, _, err := certs.CreateEtcd(dir, certs.IssueOptions{NotAfter: o.NotAfter, Hosts: []string{"127.0.0.1", "localhost"}}); err != nil {
			return nil, err
		}
	}
	return certs.Load(dir, certs.ClientID(ClientName))
}

func fileMissing(p string) bool {
	_, err := os.Stat(p)
	return errors.Is(err, fs.ErrNotExist)
}

// EtcdTLSFlags are the flags with which id (a node, or a client such as
// the demo's) reaches the etcd of EnsureCerts's directory dir: etcd's CA,
// and id's certificate for etcd's client-certificate auth.
func EtcdTLSFlags(dir string, id certs.Identity) []string {
	cf, kf := certs.Files(dir, id)
	return []string{"--etcd-cacert", filepath.Join(dir, certs.CACertFile), "--etcd-cert", cf, "--etcd-key", kf}
}

// EmbeddedEtcdTLS is the embedded etcd's TLS of EnsureCerts's directory
// dir: its server certificate, client certificates required from the
// CA; the in-process client is the one of creds.
func EmbeddedEtcdTLS(dir string, creds *certs.TLS) *claim.EmbeddedTLS {
	cf, kf := certs.EtcdFiles(dir)
	return &claim.EmbeddedTLS{CertFile: cf, KeyFile: kf, TrustedCAFile: filepath.Join(dir, certs.CACertFile), Client: creds.EtcdClientConfig()}
}

// AdminCreds are the admin's credentials in EnsureCerts's directory dir:
// the demo and chaos write the cluster (init) and etcd's users with them.
func AdminCreds(dir string) (*certs.TLS, error) {
	return certs.Load(dir, certs.ClientID(supervise.AdminClient))
}

// SetupEtcdAccess gives nodes 1..nodes and the demo's client their etcd
// users, and turns etcd's authentication on if it is not (the embedded
// etcd of the process; `rejoin etcd` has it on from its start), as
// README's walk-through does with `rejoin init`: the demo runs with the
// roles a cluster runs with (docs/DESIGN.md "Who may write etcd"). cli
// is the admin's.
func SetupEtcdAccess(ctx context.Context, cli *clientv3.Client, nodes int) error {
	a := supervise.Access{Clients: []string{ClientName}, Enable: true}
	for id := 1; id <= nodes; id++ {
		a.Nodes = append(a.Nodes, certs.NodeID(id).Name)
	}
	return supervise.SetupAccess(ctx, cli, a)
}
