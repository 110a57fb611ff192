package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/claim"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/stream/faultnet"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testLog(t testing.TB) *slog.Logger {
	var w io.Writer = io.Discard
	if testing.Verbose() {
		w = os.Stderr
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// cluster runs nodes in this process, each with its own data directory.
type cluster struct {
	t     testing.TB
	e     *claim.Embedded
	admin *clientv3.Client
	dir   string
	cfg   layout.Config
	mu    sync.Mutex
	nodes map[int]*runningNode
	// etcdFor, if set, gives node id its etcd endpoints (a proxy's);
	// nodeTTL, if set, is their lease TTL.
	etcdFor func(id int) []string
	nodeTTL time.Duration
	// proxied, if set, puts a faultnet proxy (proxies[id]) in front of
	// each node n1..n<nodes>, which listens on listen[id] and advertises
	// the proxy's address in etcd: what peers dial (feeds, rejoin links,
	// repairs) passes through the proxy, a client that dials direct(id)
	// does not. A node's feed to itself is in-process either way.
	proxied bool
	proxies map[int]*faultnet.Proxy
	listen  map[int]string
	// pairProxied, with proxied, gives each ordered pair of nodes a
	// proxy of its own, pairs[[2]int{from, to}], which node from dials
	// to reach to (knobs.peerAddr): freezing the pairs that have n2 at
	// either end cuts n2 off from its peers while they talk on, which
	// freezing proxies[1] (what n2 and n3 both dial) cannot.
	pairProxied bool
	pairs       map[[2]int]*faultnet.Proxy
	// noCutFence turns the fences for a cut between two nodes off on
	// every node (knobs.noCutFence); noReachGate lets every new process
	// register without reaching its peers (knobs.noReachGate).
	noCutFence  bool
	noReachGate bool
	// onLog, if set, sees every record a node logs at Info and above.
	onLog func(id int, r slog.Record)
}

type runningNode struct {
	cancel context.CancelFunc
	done   chan error
	addrs  Addrs
}

func newCluster(t testing.TB, nodes int, cfg layout.Config) *cluster {
	t.Helper()
	return newClusterStarting(t, nodes, nodes, cfg)
}

// newClusterStarting places replicas on nodes n1..n<nodes> and starts the
// first started of them.
func newClusterStarting(t testing.TB, nodes, started int, cfg layout.Config) *cluster {
	t.Helper()
	return newClusterWith(t, nodes, started, cfg, nil)
}

// newClusterWith is newClusterStarting with a hook that sets the
// cluster's options (c.etcdFor, c.nodeTTL) before any node starts.
func newClusterWith(t testing.TB, nodes, started int, cfg layout.Config, opts func(*cluster)) *cluster {
	t.Helper()
	dir := t.TempDir()
	// Without fsync, as every other test's etcd: the nodes' registrations
	// here live on windows of a second (TTL 2 s in many tests), and an
	// etcd write waiting on a disk the nodes' stores and other test
	// packages sync to can take that long on a shared machine.
	e, err := claim.StartEmbedded(filepath.Join(dir, "etcd"), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	admin, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	var ids []string
	for i := 1; i <= nodes; i++ {
		ids = append(ids, NodeName(i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := layout.Init(ctx, admin, cfg, ids); err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, e: e, admin: admin, dir: dir, cfg: cfg, nodes: map[int]*runningNode{}}
	if opts != nil {
		opts(c)
	}
	if c.proxied {
		c.startProxies(nodes)
	}
	t.Cleanup(c.stopAll)
	for i := 1; i <= started; i++ {
		c.start(i)
	}
	return c
}

func (c *cluster) start(id int) Addrs {
	c.t.Helper()
	return c.startWith(id, nil)
}

func (c *cluster) startWith(id int, skip func(string, txnid.ID) bool) Addrs {
	c.t.Helper()
	return c.startCfg(id, func(cfg *Config) { cfg.knobs.skip = skip })
}

// startCfg starts node id with the test's config, changed by set.
func (c *cluster) startCfg(id int, set func(*Config)) Addrs {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rn := &runningNode{cancel: cancel, done: make(chan error, 1)}
	ready := make(chan Addrs, 1)
	endpoints := c.e.Endpoints()
	if c.etcdFor != nil {
		endpoints = c.etcdFor(id)
	}
	log := testLog(c.t)
	if c.onLog != nil {
		log = slog.New(&teeHandler{Handler: log.Handler(), id: id, f: c.onLog})
	}
	cfg := Config{ID: id, Etcd: endpoints, NodeTTL: c.nodeTTL, DataDir: filepath.Join(c.dir, NodeName(id)), Log: log.With("test_node", id), Codec: wire.CodecS2,
		TLS: testCreds(c.t, certs.NodeID(id)), FaultPoints: true, Pprof: true}
	if px := c.proxies[id]; px != nil {
		cfg.Listen, cfg.Advertise = c.listen[id], px.Addr()
	}
	if c.pairs != nil {
		cfg.knobs.peerAddr = func(node, addr string) string {
			for to := range c.listen {
				if px := c.pairs[[2]int{id, to}]; px != nil && NodeName(to) == node {
					return px.Addr()
				}
			}
			return addr
		}
	}
	cfg.knobs.noCutFence, cfg.knobs.noReachGate = c.noCutFence, c.noReachGate
	if set != nil {
		set(&cfg)
	}
	go func() { rn.done <- Run(ctx, cfg, func(a Addrs) { ready <- a }) }()
	select {
	case rn.addrs = <-ready:
	case err := <-rn.done:
		c.t.Fatalf("node %d: %v", id, err)
	case <-time.After(15 * time.Second):
		c.t.Fatalf("node %d not ready", id)
	}
	c.mu.Lock()
	c.nodes[id] = rn
	c.mu.Unlock()
	return rn.addrs
}

// startProxies starts a proxy in front of each of nodes n1..n<nodes>, on
// the port each will listen on. The port is taken free and released for
// the node to bind, which a process of the machine might take meanwhile;
// knowing it before the node starts is what lets the proxy outlive node
// restarts. The proxies close after the nodes stop (cleanups run last
// first), so no node sees its peers' connections reset as it stops.
func (c *cluster) startProxies(nodes int) {
	c.t.Helper()
	c.proxies, c.listen = map[int]*faultnet.Proxy{}, map[int]string{}
	for id := 1; id <= nodes; id++ {
		addr := reservedLoopbackAddr(c.t)
		px, err := faultnet.Start(addr)
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(px.Close)
		c.proxies[id], c.listen[id] = px, addr
	}
	if !c.pairProxied {
		return
	}
	c.pairs = map[[2]int]*faultnet.Proxy{}
	for from := 1; from <= nodes; from++ {
		for to := 1; to <= nodes; to++ {
			if from == to {
				continue // a node's feed to itself is in-process
			}
			px, err := faultnet.Start(c.listen[to])
			if err != nil {
				c.t.Fatal(err)
			}
			c.t.Cleanup(px.Close)
			c.pairs[[2]int{from, to}] = px
		}
	}
}

// reservedLoopbackAddr returns a loopback address with a port free now,
// below the kernel's ephemeral range when it can: the node binds the port
// later (and again after each restart), and a port of the ephemeral range
// released meanwhile may become any connection's local port. A .ci/run
// failed so ("bind: address already in use", TestTailRepairHoldsForLivePeers
// while other packages' tests ran beside it).
func reservedLoopbackAddr(t testing.TB) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	if low > 11000 {
		for range 100 {
			port := 10000 + rand.IntN(low-10000)
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				continue
			}
			addr := ln.Addr().String()
			ln.Close()
			return addr
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// direct is the address a client dials to reach node id without its
// proxy.
func (c *cluster) direct(id int) string {
	if a, ok := c.listen[id]; ok {
		return a
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id].addrs.TCP
}

// teeHandler passes every record on to Handler and shows it to f, as
// node id's.
type teeHandler struct {
	slog.Handler
	id int
	f  func(id int, r slog.Record)
}

func (h *teeHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (h *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	h.f(h.id, r)
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &teeHandler{Handler: h.Handler.WithAttrs(as), id: h.id, f: h.f}
}

func (h *teeHandler) WithGroup(name string) slog.Handler {
	return &teeHandler{Handler: h.Handler.WithGroup(name), id: h.id, f: h.f}
}

func (c *cluster) stop(id int) {
	c.mu.Lock()
	rn := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	if rn == nil {
		return
	}
	rn.cancel()
	select {
	case err := <-rn.done:
		if err != nil {
			c.t.Errorf("node %d stopped with %v", id, err)
		}
	case <-time.After(15 * time.Second):
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		c.t.Errorf("node %d did not stop", id)
	}
}

func (c *cluster) stopAll() {
	c.mu.Lock()
	var ids []int
	for id := range c.nodes {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		c.stop(id)
	}
}

// rawClient speaks the client protocol on one connection, one call at a
// time: enough to test the node without the client package.
type rawClient struct {
	conn *stream.Conn
	req  uint64
}

func dialClient(t *testing.T, addr string) *rawClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn := dialAs(t, ctx, addr, certs.ClientID("test"), "")
	t.Cleanup(func() { conn.Close() })
	if err := hello(ctx, conn, &wire.Hello{Kind: wire.HelloClient, Node: "test"}, ""); err != nil {
		t.Fatal(err)
	}
	// A call never answered fails its test, not the package's timeout.
	conn.SetStallWindow(rawCallMax)
	return &rawClient{conn: conn}
}

// rawCallMax bounds the wait for a rawClient's answer: every node bound
// on a call is far below it.
const rawCallMax = 60 * time.Second

func (c *rawClient) call(p uint32, proc string, each bool, vals ...wire.Value) (*wire.Reply, error) {
	params, err := wire.NewTupleEncoder().AppendTuple(nil, vals)
	if err != nil {
		return nil, err
	}
	c.req++
	if err := c.conn.Send(context.Background(), &wire.Call{Req: c.req, Partition: p, Proc: proc, Params: params, Each: each}); err != nil {
		return nil, err
	}
	m, err := c.conn.Recv()
	if err != nil {
		return nil, err
	}
	r, ok := m.(*wire.Reply)
	if !ok || r.Req != c.req {
		return nil, fmt.Errorf("got %v", m)
	}
	if r.Err != "" {
		return r, fmt.Errorf("%s", r.Err)
	}
	cp := *r
	cp.Each = append([]wire.ReplicaOut(nil), r.Each...)
	return &cp, nil
}

func kv() layout.Config {
	return layout.Config{Partitions: 2, Replicas: 2, Tables: []layout.Table{layout.KV()}}
}

func upsert(t *testing.T, c *rawClient, parts uint32, i int) {
	t.Helper()
	key := wire.Bytes(fmt.Appendf(nil, "key-%06d", i))
	p, err := partition.RouteValues([]wire.Value{key}, parts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.call(p, partition.ProcUpsert, false, wire.String("kv"), key, wire.Bytes(fmt.Appendf(nil, "value-%d", i))); err != nil {
		t.Fatalf("upsert %d: %v", i, err)
	}
}

// checkDigests reads every partition's digest on every replica at one
// txn and fails on a difference or a missing live replica. A replica just
// gone live answers once the calling node's membership view has it live
// (polled every 100 ms, from etcd): fewer answers are read again, up to
// 5 s.
func checkDigests(t *testing.T, c *rawClient, parts uint32, replicas int) {
	t.Helper()
	for p := range parts {
		var r *wire.Reply
		// A failed call is retried like a short answer: the node asked
		// may be unregistered for a moment on a loaded machine
		// (readAcked).
		for deadline := time.Now().Add(ackedReadWait); ; time.Sleep(50 * time.Millisecond) {
			var err error
			r, err = c.call(p, partition.ProcDigest, true)
			if err != nil && time.Now().After(deadline) {
				t.Fatalf("digest of %d: %v", p, err)
			}
			if err == nil && (len(r.Each) == replicas || time.Now().After(deadline)) {
				break
			}
		}
		if len(r.Each) != replicas {
			t.Fatalf("partition %d: %d replicas answered, want %d", p, len(r.Each), replicas)
		}
		for _, e := range r.Each[1:] {
			if string(e.Out) != string(r.Each[0].Out) {
				t.Fatalf("partition %d at %v: %s has %x, %s has %x", p, r.ID, r.Each[0].Node, r.Each[0].Out, e.Node, e.Out)
			}
		}
	}
}

// TestNodeRestartRejoins: three nodes, two replicas per partition; a
// node stops and comes back empty; its replicas rejoin from live ones
// while writes go on, and every replica ends with the same digest.
func TestNodeRestartRejoins(t *testing.T) {
	c := newCluster(t, 3, kv())
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 2)
	for i := range 2000 {
		upsert(t, cl, 2, i)
	}
	checkDigests(t, cl, 2, 2)
	c.stop(3)
	for i := 2000; i < 2500; i++ {
		upsert(t, cl, 2, i)
	}
	c.start(3)
	deadline := time.Now().Add(30 * time.Second)
	i := 2500
	for {
		upsert(t, cl, 2, i)
		i++
		st := c.nodes[3].addrs
		_ = st
		if allLive(t, c) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("replicas of n3 not live in 30 s")
		}
	}
	for j := 0; j < 200; j++ {
		upsert(t, cl, 2, i+j)
	}
	checkDigests(t, cl, 2, 2)
}

func allLive(t *testing.T, c *cluster) bool {
	reps, err := supervisorReplicas(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		if !r {
			return false
		}
	}
	return true
}

func supervisorReplicas(c *cluster) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reps, err := supervise.Replicas(ctx, c.admin)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range reps {
		out[fmt.Sprintf("%d/%s", r.Partition, r.Node)] = r.State == recovery.ReplicaLive
	}
	return out, nil
}

// waitWritable waits until every partition takes a write: the cluster is
// bootstrapped, the nodes' feeds are open and their replicas live.
func waitWritable(t *testing.T, c *rawClient, parts uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p := range parts {
		for {
			_, err := c.call(p, partition.ProcDigest, false)
			if err == nil {
				break
			}
			// A node that lost its registration while the cluster started
			// (etcd slow to answer for a window: the tests' TTL is 2 s)
			// registers again by itself; a client goes on as it would.
			waiting := strings.Contains(err.Error(), "no live replica") || strings.Contains(err.Error(), "not bootstrapped") ||
				strings.Contains(err.Error(), "not registered")
			if !waiting || time.Now().After(deadline) {
				t.Fatalf("partition %d not writable: %v", p, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// fault posts to a node's fault endpoint.
func fault(t *testing.T, addrs Addrs, path string) {
	t.Helper()
	resp, err := adminClient(t, certs.ClientID(certs.AdminName)).Post("https://"+addrs.HTTP+path, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s: %s", path, resp.Status, body)
	}
}

func nodeStatus(t *testing.T, addrs Addrs) Status {
	t.Helper()
	resp, err := http.Get("http://" + addrs.HTTP + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestCutLinkResumes drops the rejoin's TCP connection in the middle of
// the snapshot: the source redials, both ends resume the same attempt
// (same epoch), and at most one window of blocks is sent again.
func TestCutLinkResumes(t *testing.T) {
	c := newCluster(t, 2, layout.Config{Partitions: 1, Replicas: 2, Tables: []layout.Table{layout.KV()}})
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 1)
	// 40k rows of ~1 KB in 400-row txns: a snapshot of ~160 blocks.
	rows := make([]wire.Value, 0, 2+2*400)
	for b := range 100 {
		rows = append(rows[:0], wire.String("kv"), wire.Int64(400))
		for i := range 400 {
			k := b*400 + i
			rows = append(rows, wire.Bytes(fmt.Appendf(nil, "key-%08d", k)), wire.Bytes(make([]byte, 1000)))
		}
		if _, err := cl.call(0, partition.ProcUpsertMany, false, rows...); err != nil {
			t.Fatal(err)
		}
	}
	c.stop(2)
	// The source holds the stream once 10k rows are out.
	fault(t, c.nodes[1].addrs, "/fault/hold?partition=0&rows=10000")
	a2 := c.start(2)
	var src RejoinStatus
	waitUntil(t, 20*time.Second, "the source to hold mid-snapshot", func() bool {
		st := nodeStatus(t, c.nodes[1].addrs)
		if len(st.Replicas) == 1 && len(st.Replicas[0].Sources) == 1 && st.Replicas[0].Sources[0].Held {
			src = st.Replicas[0].Sources[0]
			return true
		}
		return false
	})
	fault(t, c.nodes[1].addrs, "/fault/cut-link?partition=0")
	fault(t, c.nodes[1].addrs, "/fault/release?partition=0")
	var dst *RejoinStatus
	waitUntil(t, 30*time.Second, "the destination live", func() bool {
		st := nodeStatus(t, a2)
		dst = st.Replicas[0].Rejoin
		return st.Replicas[0].State == recovery.ReplicaLive
	})
	// The source publishes its status on its own ticks: wait for it to
	// say its attempt is over before reading what it streamed.
	var final RejoinStatus
	waitUntil(t, 10*time.Second, "the source's attempt done", func() bool {
		srcs := nodeStatus(t, c.nodes[1].addrs).Replicas[0].Sources
		if len(srcs) == 0 {
			return false
		}
		final = srcs[0]
		return final.Phase == "done"
	})
	t.Logf("held at %d rows; source after: epoch %d, %d rows, %d blocks resent; destination epoch %d", src.SnapshotRows, final.Epoch, final.Rows, final.BlocksResent, dst.Epoch)
	if final.Epoch != src.Epoch || dst.Epoch != src.Epoch {
		t.Fatalf("the attempt restarted: epochs %d, %d, %d", src.Epoch, final.Epoch, dst.Epoch)
	}
	if final.BlocksResent < 1 || final.BlocksResent > 16 {
		t.Fatalf("%d blocks resent, want 1..16 (one window)", final.BlocksResent)
	}
	for i := range 100 {
		upsert(t, cl, 1, i)
	}
	checkDigests(t, cl, 1, 2)

	// The source's metrics tell the same story as its status.
	resp, err := http.Get("http://" + c.nodes[1].addrs.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		fmt.Sprintf("rejoin_rows_streamed{partition=\"0\",role=\"source\"} %d", final.Rows),
		`rejoin_phase{partition="0",phase="done",role="source"} 1`,
		`rejoin_attempts_total{outcome="ok",role="source"} 1`,
		`rejoin_replica_live{partition="0",state="live"} 1`,
		"rejoin_store_txns_executed_total ",
		"rejoin_handoff_pause_ms{partition=\"0\"}",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// And its profiles are there to be read.
	resp, err = adminClient(t, certs.ClientID(certs.AdminName)).Get("https://" + c.nodes[1].addrs.HTTP + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile: total") {
		t.Errorf("/debug/pprof/goroutine: %s: %.200s", resp.Status, body)
	}
}

func waitUntil(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDeadInitiatorTailRepaired: a node's initiator sends a write to two
// of the partition's three replicas and dies before the third gets it
// (the test's skip hook stands for the feed it never flushed). The
// survivors repair the tail between them before they stop waiting for
// the dead initiator, so both hold the write and their digests match.
// Without the repair the replica that missed it diverges.
func TestDeadInitiatorTailRepaired(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newClusterStarting(t, 3, 2, cfg)
	var mu sync.Mutex
	var torn txnid.ID
	armed := false
	// Once armed, nothing more goes to n2, heartbeats included: a feed
	// is one ordered stream, so a node that missed a txn got nothing
	// after it either.
	skip := func(node string, id txnid.ID) bool {
		mu.Lock()
		defer mu.Unlock()
		if armed && node == NodeName(2) {
			if torn == 0 {
				torn = id
			}
			return true
		}
		return false
	}
	// The placement gave n3 a replica too (three replicas on n1..n3 by
	// layout.Init's node list); start it with the hook.
	a3 := c.startWith(3, skip)
	cl3 := dialClient(t, a3.TCP)
	waitWritable(t, cl3, 1)
	for i := range 200 {
		upsert(t, cl3, 1, i)
	}
	mu.Lock()
	armed = true
	mu.Unlock()
	// Acknowledged: n2 was never waited for, the hook dropped it.
	upsert(t, cl3, 1, 1_000_000)
	mu.Lock()
	id := torn
	mu.Unlock()
	if id == 0 {
		t.Fatal("the hook never tore a txn")
	}
	c.stop(3)
	cl1 := dialClient(t, c.nodes[1].addrs.TCP)
	waitUntil(t, 20*time.Second, "n3 gone from the partition's live replicas", func() bool {
		r, err := cl1.call(0, partition.ProcDigest, true)
		return err == nil && len(r.Each) == 2
	})
	checkDigests(t, cl1, 1, 2)
	st := nodeStatus(t, c.nodes[2].addrs)
	t.Logf("torn txn %v; n2 rows %d, state %s", id, st.Replicas[0].Rows, st.Replicas[0].State)
	if st.Replicas[0].State != recovery.ReplicaLive {
		t.Fatalf("n2's replica is %s", st.Replicas[0].State)
	}
}

// TestWipedDataDirRejoins: a node restarted with an empty data directory
// is not a new node: etcd says it ran before, so every replica of it
// rejoins from a live one instead of starting live and empty.
func TestWipedDataDirRejoins(t *testing.T) {
	c := newCluster(t, 3, kv())
	cl := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl, 2)
	for i := range 1000 {
		upsert(t, cl, 2, i)
	}
	c.stop(3)
	if err := os.RemoveAll(filepath.Join(c.dir, NodeName(3))); err != nil {
		t.Fatal(err)
	}
	a3 := c.start(3)
	st := nodeStatus(t, a3)
	if len(st.Replicas) == 0 {
		t.Fatal("n3 hosts no replica")
	}
	for _, r := range st.Replicas {
		if r.State == recovery.ReplicaLive && r.Rejoin == nil {
			t.Fatalf("n3 started with partition %d live and empty (%d rows)", r.Partition, r.Rows)
		}
	}
	waitUntil(t, 30*time.Second, "every replica live", func() bool { return allLive(t, c) })
	for _, r := range nodeStatus(t, a3).Replicas {
		if r.Rejoin == nil || r.Rejoin.Phase != "live" {
			t.Fatalf("partition %d on n3 is %s without a rejoin (%+v)", r.Partition, r.State, r.Rejoin)
		}
	}
	for i := 1000; i < 1100; i++ {
		upsert(t, cl, 2, i)
	}
	checkDigests(t, cl, 2, 2)
}

// TestRepairPeerHoldsNothing: when an initiator dies, each surviving
// replica repairs its tail from its peers. A peer whose replica needs a
// rejoin holds nothing that will ever run, like a dead one; it used to
// answer with an error, counted as a failed repair, and the last live
// replica of the partition failed with "initiator 1's tail not repaired:
// [n3: peer: replica 0 holds nothing (needs-rejoin)]" (found by rejoin
// chaos).
func TestRepairPeerHoldsNothing(t *testing.T) {
	cfg := layout.Config{Partitions: 1, Replicas: 3, Tables: []layout.Table{layout.KV()}}
	c := newCluster(t, 3, cfg)
	cl1 := dialClient(t, c.nodes[1].addrs.TCP)
	waitWritable(t, cl1, 1)
	for i := range 100 {
		upsert(t, cl1, 1, i)
	}
	c.stop(3)
	c.startCfg(3, func(cfg *Config) { cfg.knobs.noTasks = true })
	for i := 100; i < 200; i++ {
		upsert(t, cl1, 1, i)
	}
	if st := nodeStatus(t, c.nodes[3].addrs).Replicas[0].State; st != recovery.ReplicaNeedsRejoin {
		t.Fatalf("n3's replica is %s, want %s", st, recovery.ReplicaNeedsRejoin)
	}
	c.stop(1)
	// n2 repairs n1's tail from n3 (alive, holding nothing); a failed
	// answer was retried for up to 3 node TTLs, then failed the replica:
	// watch past that.
	deadline := time.Now().Add(3*4*time.Second + 5*time.Second)
	for time.Now().Before(deadline) {
		if st := nodeStatus(t, c.nodes[2].addrs).Replicas[0]; st.State != recovery.ReplicaLive {
			t.Fatalf("n2's replica, the last live one, is %s", st.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cl2 := dialClient(t, c.nodes[2].addrs.TCP)
	upsert(t, cl2, 1, 1_000_000)
}

// testEtcd starts an embedded etcd for one test and returns a client to
// it and a context bounded to timeout; all three end with the test, the
// etcd last (cleanups run last first), after what the test released.
func testEtcd(t *testing.T, timeout time.Duration) (*clientv3.Client, context.Context) {
	t.Helper()
	e, err := claim.StartEmbedded(t.TempDir(), claim.EmbeddedOptions{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	cli, err := e.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return cli, ctx
}

// TestSecondProcessOfRunningNodeRefused (issue 24, point 6): `rejoin
// node --id 1` with another data directory while n1 runs is refused, and
// the error names the flag that replaces the running process; n1 runs on.
// With the flag, the new process takes over and the old one stops,
// superseded. A crashed process's record, left on its lease, does not
// hold back a restart from its own data directory.
func TestSecondProcessOfRunningNodeRefused(t *testing.T) {
	c := newCluster(t, 1, onePartition())
	second := func(replace bool) (chan error, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		cfg := Config{ID: 1, Etcd: c.e.Endpoints(), DataDir: t.TempDir(), Log: testLog(t).With("test_node", "1b"),
			TLS: testCreds(t, certs.NodeID(1)), ReplaceRunning: replace}
		done := make(chan error, 1)
		go func() { done <- Run(ctx, cfg, nil) }()
		return done, cancel
	}
	done, cancel := second(false)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "is running") || !strings.Contains(err.Error(), "--replace-running") {
			t.Fatalf("a second n1 with another data directory: %v, want a refusal naming --replace-running", err)
		}
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatal("a second n1 with another data directory started while n1 runs")
	}
	cancel()
	if st := nodeStatus(t, c.nodes[1].addrs); st.Node != "n1" {
		t.Fatalf("n1's status after the refusal: %+v", st)
	}
	select {
	case err := <-c.nodes[1].done:
		t.Fatalf("the running n1 stopped: %v", err)
	default:
	}

	done, cancel = second(true)
	defer func() {
		cancel()
		<-done
	}()
	select {
	case err := <-c.nodes[1].done:
		if !errors.Is(err, supervise.ErrSuperseded) {
			t.Fatalf("n1 replaced: stopped with %v, want ErrSuperseded", err)
		}
		c.mu.Lock()
		delete(c.nodes, 1)
		c.mu.Unlock()
	case err := <-done:
		t.Fatalf("--replace-running: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("--replace-running did not replace the running n1")
	}
}

// TestCrashedNodeRestartsAtOnce: a process that died without leaving
// etcd leaves its record on its lease; the next start from the same data
// directory replaces it without waiting for the lease (its data
// directory's lock says that process is gone).
func TestCrashedNodeRestartsAtOnce(t *testing.T) {
	c := newClusterWith(t, 1, 0, onePartition(), func(c *cluster) { c.nodeTTL = time.Minute })
	c.startCfg(1, func(cfg *Config) { cfg.knobs.crash = true })
	c.stop(1)
	resp, err := c.admin.Get(context.Background(), supervise.NodeKey("n1"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the crashed n1's record: %v %v", resp, err)
	}
	c.start(1) // within startCfg's 15 s, well inside the minute's lease
}
