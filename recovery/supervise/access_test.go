package supervise

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
)

// TestAccessRoles (issue 24, point 3): with etcd's authentication on and
// the roles SetupAccess writes, over client-certificate auth, a client
// certificate reads the cluster and writes nothing, a node's writes
// what a node writes but not the cluster's config nor another node's
// incarnation, and the admin's (client:root) writes anything; a
// certificate of the CA with no user is refused everything.
func TestAccessRoles(t *testing.T) {
	checkLeaks(t)
	dir := filepath.Join(t.TempDir(), "certs")
	if _, err := certs.CreateCA(dir, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, _, err := certs.CreateEtcd(dir, certs.IssueOptions{Hosts: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	creds := map[string]*certs.TLS{}
	for _, id := range []certs.Identity{certs.ClientID("root"), certs.ClientID("scraper"), certs.ClientID("stranger"), certs.NodeID(2), certs.NodeID(3)} {
		if _, _, err := certs.Create(dir, id, certs.IssueOptions{}); err != nil {
			t.Fatal(err)
		}
		c, err := certs.Load(dir, id)
		if err != nil {
			t.Fatal(err)
		}
		creds[id.String()] = c
	}
	cf, kf := certs.EtcdFiles(dir)
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true, TLS: &claim.EmbeddedTLS{
		CertFile: cf, KeyFile: kf, TrustedCAFile: filepath.Join(dir, certs.CACertFile), Client: creds["client:root"].EtcdClientConfig()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	as := func(who string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			TLS: creds[who].EtcdClientConfig()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	ctx := testCtx(t, 30*time.Second)
	admin := as("client:root")
	if on, err := AuthEnabled(ctx, admin); err != nil || on {
		t.Fatalf("auth before setup: %v %v", on, err)
	}
	a := Access{Nodes: []string{"n2", "n3"}, Clients: []string{"scraper"}, Enable: true}
	if err := SetupAccess(ctx, admin, a); err != nil {
		t.Fatal(err)
	}
	if err := SetupAccess(ctx, admin, a); err != nil {
		t.Fatalf("setup again, auth on, as admin: %v", err)
	}
	if on, err := AuthEnabled(ctx, admin); err != nil || !on {
		t.Fatalf("auth after setup: %v %v", on, err)
	}
	const config = "/rejoin/cluster"
	if _, err := admin.Put(ctx, config, "{}"); err != nil {
		t.Fatalf("admin writes the config: %v", err)
	}
	denied := func(who, what string, err error) {
		t.Helper()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s %s: %v, want permission denied", who, what, err)
		}
	}
	allowed := func(who, what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s %s: %v", who, what, err)
		}
	}
	scraper, n3, stranger := as("client:scraper"), as("node:n3"), as("client:stranger")
	_, err = scraper.Get(ctx, config)
	allowed("a client", "reads the config", err)
	_, err = scraper.Put(ctx, config, "{}")
	denied("a client", "writes the config", err)
	_, err = scraper.Put(ctx, NodeKey("n9"), "{}")
	denied("a client", "writes a node record", err)
	_, err = scraper.Delete(ctx, keyRoot, clientv3.WithPrefix())
	denied("a client", "deletes /rejoin/", err)
	_, err = n3.Put(ctx, IncarnationKey("n3"), "{}")
	allowed("n3", "writes its incarnation", err)
	_, err = n3.Put(ctx, IncarnationKey("n2"), "{}")
	denied("n3", "writes n2's incarnation", err)
	_, err = n3.Put(ctx, config, "{}")
	denied("n3", "writes the config", err)
	_, err = n3.Put(ctx, MoveKey(1), "{}")
	denied("n3", "writes a move", err)
	_, err = n3.Put(ctx, BootstrappedKey, "1")
	denied("n3", "writes the bootstrap mark", err)
	for _, k := range []string{NodeKey("n3"), ReplicaKey(1, "n3"), claim.Task{Partition: 1, Dest: "n3"}.ClaimKey(), claim.Task{Partition: 1, Dest: "n3"}.RecordKey(), AssignmentKey(claim.Task{Partition: 1, Dest: "n3"}), electionPrefix + "/1"} {
		_, err = n3.Put(ctx, k, "{}")
		allowed("n3", "writes "+k, err)
	}
	_, err = n3.Get(ctx, keyRoot, clientv3.WithPrefix())
	allowed("n3", "reads /rejoin/", err)
	lease, err := n3.Grant(ctx, 5)
	allowed("n3", "grants a lease", err)
	if err == nil {
		_, err = n3.Put(ctx, NodeKey("n3"), "{}", clientv3.WithLease(lease.ID))
		allowed("n3", "writes its record on a lease", err)
		_, err = n3.KeepAliveOnce(ctx, lease.ID)
		allowed("n3", "keeps its lease", err)
		_, err = n3.Revoke(ctx, lease.ID)
		allowed("n3", "revokes its lease", err)
	}
	_, err = stranger.Get(ctx, config)
	denied("a certificate without a user", "reads", err)
}
