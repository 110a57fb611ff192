package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// testCA is the cluster CA of every node this test binary starts: one
// key pair for the binary, a certificate per use (cheap: P-256).
var testCA = sync.OnceValues(func() (*certs.CA, error) { return certs.NewCA(time.Now(), 24*time.Hour) })

// testCreds issues id a certificate from testCA.
func testCreds(t testing.TB, id certs.Identity) *certs.TLS {
	t.Helper()
	ca, err := testCA()
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.Credentials(id, certs.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dialAs dials addr with the credentials of id (want: the node that must
// answer, "" for any).
func dialAs(t testing.TB, ctx context.Context, addr string, id certs.Identity, want string) *stream.Conn {
	t.Helper()
	conn, err := stream.Dial(ctx, addr, stream.Config{Codec: wire.CodecNone, TLS: testCreds(t, id).DialConfig(want)})
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// syncBuffer is a log sink a node writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestUnauthorizedPeersRefused (issue 13): a dialler without a
// certificate, with one from another CA, with an expired one, or with a
// valid certificate that does not allow its hello (a client opening a
// feed, rejoin or repair stream; a node feeding as another initiator,
// rejoining or repairing as another node, or calling procedures) is
// refused with an error on both ends, and nothing reaches a replica.
func TestUnauthorizedPeersRefused(t *testing.T) {
	c := newClusterStarting(t, 2, 1, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	var logs syncBuffer
	a := c.startCfg(2, func(cfg *Config) {
		cfg.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	upsert(t, cl, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	replicas := func() string {
		st := nodeStatus(t, a)
		b, err := json.Marshal(st.Replicas)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	before := replicas()

	ca, err := testCA()
	if err != nil {
		t.Fatal(err)
	}
	other, err := certs.NewCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Credentials(certs.NodeID(1), certs.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := ca.Credentials(certs.NodeID(1), certs.IssueOptions{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	// Diallers that trust any server and present what they have: the
	// refusal is the node's.
	trustAny := func(cfg *tls.Config) *tls.Config {
		cfg.VerifyConnection = nil
		return cfg
	}
	noCert := trustAny(testCreds(t, certs.NodeID(1)).DialConfig(""))
	noCert.Certificates = nil

	feed := &wire.Hello{Kind: wire.HelloFeed, Node: "n1", Initiator: 1, Epoch: 1}
	rejoin := &wire.Hello{Kind: wire.HelloRejoin, Node: "n1", Partition: 0, Epoch: 1}
	repair := &wire.Hello{Kind: wire.HelloRepair, Node: "n1"}
	client := &wire.Hello{Kind: wire.HelloClient}
	for _, tc := range []struct {
		name    string
		tls     *tls.Config // nil: plain TCP
		hello   *wire.Hello
		dialErr string // the dialler's error
		nodeLog string // what the node logs
	}{
		{"plain TCP", nil, feed, "node n2 serves mutual TLS only: dial it with a certificate of the cluster's CA", "first record does not look like a TLS handshake"},
		{"no certificate", noCert, feed, "certificate required", "didn't provide a certificate"},
		{"another CA", trustAny(foreign.DialConfig("")), feed, "unknown certificate authority", "certificate signed by unknown authority"},
		{"expired", trustAny(expired.DialConfig("")), feed, "expired certificate", "certificate has expired"},
		{"client feeds", testCreds(t, certs.ClientID("c1")).DialConfig("n2"), &wire.Hello{Kind: wire.HelloFeed, Node: "c1", Initiator: 1}, "client:c1 may only call procedures, not open a feed stream", "client:c1 may only call procedures"},
		{"client rejoins", testCreds(t, certs.ClientID("c2")).DialConfig("n2"), rejoin, "client:c2 may only call procedures, not open a rejoin stream", "client:c2 may only call procedures"},
		{"client repairs", testCreds(t, certs.ClientID("c3")).DialConfig("n2"), repair, "client:c3 may only call procedures, not open a repair stream", "client:c3 may only call procedures"},
		{"n3 feeds as initiator 1", testCreds(t, certs.NodeID(3)).DialConfig("n2"), &wire.Hello{Kind: wire.HelloFeed, Node: "n3", Initiator: 1, Epoch: 1}, "feed hello for initiator 1, but the certificate is node:n3 (initiator 3)", "initiator 1, but the certificate is node:n3"},
		{"n3 feeds as n1", testCreds(t, certs.NodeID(3)).DialConfig("n2"), feed, `feed hello says node "n1", but the certificate is node:n3`, `says node \"n1\", but the certificate is node:n3`},
		{"n3 rejoins as n1", testCreds(t, certs.NodeID(3)).DialConfig("n2"), rejoin, `rejoin hello says node "n1", but the certificate is node:n3`, `rejoin hello says node \"n1\"`},
		{"n3 repairs as n1", testCreds(t, certs.NodeID(3)).DialConfig("n2"), repair, `repair hello says node "n1", but the certificate is node:n3`, `repair hello says node \"n1\"`},
		{"n3 calls", testCreds(t, certs.NodeID(3)).DialConfig("n2"), client, "node:n3 may not open a client connection", "node:n3 may not open a client connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tryHello(ctx, a.TCP, tc.tls, tc.hello)
			if err == nil || (tc.dialErr != "" && !strings.Contains(err.Error(), tc.dialErr)) {
				t.Fatalf("dialler: %v, want an error with %q", err, tc.dialErr)
			}
			waitUntil(t, 5*time.Second, "the node logs the refusal", func() bool { return strings.Contains(logs.String(), tc.nodeLog) })
		})
	}
	if after := replicas(); after != before {
		t.Fatalf("a refused dialler changed a replica:\nbefore %s\nafter  %s", before, after)
	}
	// The node's own peers and clients still get through.
	cl2 := dialClient(t, a.TCP)
	upsert(t, cl2, 1, 2)
	checkDigests(t, cl2, 1, 2)
}

// tryHello dials addr (TLS with cfg, plain TCP if nil), says h and
// returns the error that refused it, nil if the node answered hello.
func tryHello(ctx context.Context, addr string, cfg *tls.Config, h *wire.Hello) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := stream.Dial(ctx, addr, stream.Config{Codec: wire.CodecNone, TLS: cfg})
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	return hello(ctx, conn, h, "")
}

// TestNodeRefusesWithoutCertificates: secure by default; --insecure is
// said in /status.
func TestNodeRefusesWithoutCertificates(t *testing.T) {
	c := newClusterStarting(t, 1, 0, onePartition())
	cfg := Config{ID: 1, Etcd: c.e.Endpoints(), DataDir: t.TempDir(), Log: testLog(t)}
	err := Run(context.Background(), cfg, nil)
	if err == nil || !strings.Contains(err.Error(), "no certificates") || !strings.Contains(err.Error(), "--insecure") {
		t.Fatalf("Run without certificates: %v", err)
	}
	cfg.TLS = testCreds(t, certs.NodeID(2))
	if err := Run(context.Background(), cfg, nil); err == nil || !strings.Contains(err.Error(), "node:n2's, not node n1's") {
		t.Fatalf("Run with another node's certificate: %v", err)
	}
	a := c.startCfg(1, func(cfg *Config) { cfg.TLS, cfg.Insecure = nil, true })
	if st := nodeStatus(t, a); !st.Insecure || st.TLS {
		t.Fatalf("insecure node's status: insecure %v tls %v", st.Insecure, st.TLS)
	}
	// Plain TCP works on it (and only on it).
	conn, err := stream.Dial(context.Background(), a.TCP, stream.Config{Codec: wire.CodecNone})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := hello(context.Background(), conn, &wire.Hello{Kind: wire.HelloClient}, ""); err != nil {
		t.Fatal(err)
	}
}

// TestRejoinNeedsClaimAndCertificate (issue 13): the destination serves a
// rejoin stream only from the node whose certificate made the connection
// and which holds the task's claim at the hello's epoch: n3's valid
// certificate without the claim is refused, and so is the claim holder's
// name over another node's certificate.
func TestRejoinNeedsClaimAndCertificate(t *testing.T) {
	c := newCluster(t, 2, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := claim.Acquire(ctx, c.admin, claim.Task{Partition: 0, Dest: NodeName(2)}, supervise.ExecutorID("n1"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Release(ctx) }()
	e := cl.Epoch()
	try := func(cert int, node string, epoch uint64) error {
		conn := dialAs(t, ctx, c.nodes[2].addrs.TCP, certs.NodeID(cert), NodeName(2))
		defer conn.Close()
		return hello(ctx, conn, &wire.Hello{Kind: wire.HelloRejoin, Node: node, Partition: 0, Epoch: epoch}, NodeName(2))
	}
	for _, tc := range []struct {
		cert  int
		node  string
		epoch uint64
		want  string
	}{
		{3, "n3", e, `the claim on task`},      // a valid node, no claim
		{1, "n1", e + 1, `the claim on task`},  // the holder, another epoch
		{3, "n1", e, `certificate is node:n3`}, // the holder's name, n3's certificate
		// The holder, but a claim no assignment gave it (issue 24, point
		// 3): any node may write claims in etcd, so the claim alone does
		// not authorise it.
		{1, "n1", e, "the supervisor assigned it to nobody"},
	} {
		if err := try(tc.cert, tc.node, tc.epoch); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("certificate n%d, hello %s at %d (claim n1's at %d): %v, want %q", tc.cert, tc.node, tc.epoch, e, err, tc.want)
		}
	}
}

// TestFeedTxnOfAnotherInitiatorRefused (issue 24, point 4): a feed is
// authorised as one initiator by its certificate, and so is every txn on
// it, not only its heartbeats: n3's feed carrying a txn ID of initiator 1
// is closed, and the txn reaches no replica.
func TestFeedTxnOfAnotherInitiatorRefused(t *testing.T) {
	c := newClusterStarting(t, 3, 1, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	var logs syncBuffer
	a := c.startCfg(2, func(cfg *Config) {
		cfg.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := dialAs(t, ctx, a.TCP, certs.NodeID(3), NodeName(2))
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := hello(ctx, conn, &wire.Hello{Kind: wire.HelloFeed, Node: "n3", Initiator: 3, Epoch: 1, To: incarnationOf(t, c, 2)}, NodeName(2)); err != nil {
		t.Fatal(err)
	}
	forged := txnid.Make(time.Now().UnixMilli()-txnid.EpochUnixMillis, 1, 1)
	if err := conn.Send(ctx, &wire.Txn{Partition: 0, ID: forged, Proc: "upsert"}); err != nil {
		t.Fatal(err)
	}
	// The node closes the feed: Recv ends (after the floor it sent).
	for {
		if _, err := conn.Recv(); err != nil {
			break
		}
	}
	if ctx.Err() != nil {
		t.Fatal("the feed carrying initiator 1's txn was not closed")
	}
	want := "txn " + forged.String() + " of initiator 1 on the feed of initiator 3"
	waitUntil(t, 5*time.Second, "the node logs why it ended the feed", func() bool { return strings.Contains(logs.String(), want) })
	upsert(t, cl, 1, 1)
	checkDigests(t, cl, 1, 2)
}

// incarnationOf returns node id's incarnation as its record in etcd
// names it, what a feed's hello to it names (wire.Hello.To).
func incarnationOf(t *testing.T, c *cluster, id int) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := supervise.Nodes(ctx, c.admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.ID == NodeName(id) {
			return uint64(incarnation(r))
		}
	}
	t.Fatalf("n%d has no record", id)
	return 0
}

// TestFeedHelloNamesItsReceiver: a feed's hello names the receiver's
// process it means (wire.Hello.To), and a node's process refuses a feed
// meant for another of its processes. A sender whose view lagged a
// restart opened its feed to the new process under the old one's name,
// took it for stale once its view caught up, and dialled again afresh;
// the new process read that as one process re-opening a feed it sent
// txns on without resuming, and failed every replica it held (rejoin
// chaos --duration 10m --seed 20261128: with other nodes down, the last
// live replicas of two partitions).
func TestFeedHelloNamesItsReceiver(t *testing.T) {
	c := newClusterStarting(t, 3, 2, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inc := incarnationOf(t, c, 2)
	for _, tc := range []struct {
		to   uint64
		want string // "": served
	}{
		{inc - 1, fmt.Sprintf("feed meant for n2's process %d, this is process %d", inc-1, inc)},
		{0, fmt.Sprintf("feed meant for n2's process 0, this is process %d", inc)},
		{inc, ""},
	} {
		conn := dialAs(t, ctx, c.nodes[2].addrs.TCP, certs.NodeID(3), NodeName(2))
		err := hello(ctx, conn, &wire.Hello{Kind: wire.HelloFeed, Node: "n3", Initiator: 3, Epoch: 1, To: tc.to}, NodeName(2))
		conn.Close()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("feed meant for n2's process %d, which it is: %v", tc.to, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("feed meant for n2's process %d: %v, want refused with %q", tc.to, err, tc.want)
		}
	}
	upsert(t, cl, 1, 1)
	checkDigests(t, cl, 1, 2)
}

// TestRepairNeedsReplica (issue 24, point 4): a repair stream gives a
// replica's txns only to a node the placement gives a replica of that
// partition.
func TestRepairNeedsReplica(t *testing.T) {
	c := newClusterStarting(t, 3, 2, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	place, err := supervise.Place([]string{"n1", "n2", "n3"}, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := place[0]; len(got) != 2 || got[0] == "n3" || got[1] == "n3" {
		t.Fatalf("partition 0 placed on %v; the test needs n3 without it", got)
	}
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	upsert(t, cl, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := dialAs(t, ctx, c.nodes[2].addrs.TCP, certs.NodeID(3), NodeName(2))
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := hello(ctx, conn, &wire.Hello{Kind: wire.HelloRepair, Node: "n3"}, NodeName(2)); err != nil {
		t.Fatal(err)
	}
	if err := conn.Send(ctx, &wire.Repair{Partition: 0, Initiator: 9, Incarnation: 1}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := conn.Recv()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *wire.Txn:
			t.Fatalf("n3, which holds no replica of partition 0, was given its txn %v", m.ID)
		case *wire.RepairEnd:
			if want := "n3 holds no replica of partition 0"; !strings.Contains(m.Err, want) {
				t.Fatalf("repair answered %q, want an error with %q", m.Err, want)
			}
			return
		default:
			t.Fatalf("unexpected %v", m.Type())
		}
	}
}
