package node

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// CallWaitDefault is Config.CallWait's default: below the client's own
// timeout (client.TimeoutDefault, 10 s), so a caller that waited hears
// why rather than only that it timed out.
const CallWaitDefault = 8 * time.Second

// ErrConfig: a flag of the node out of range.
var ErrConfig = errors.New("node: bad config")

// Config configures one node process (`rejoin node`).
type Config struct {
	// ID is the node's number, 1..txnid.InitiatorsMax-1: its id is "n<ID>"
	// and its initiator's id is ID.
	ID int
	// Listen is the TCP address for clients, feeds and rejoin streams;
	// HTTP the admin address (status, metrics, faults). Both default to
	// loopback with a free port.
	Listen, HTTP string
	// Advertise is the address peers and clients dial, registered in
	// etcd: "host:port", or "host" for the bound port of Listen (and of
	// HTTP if that is a wildcard too). Needed when Listen is a wildcard
	// (0.0.0.0, ::, or no host), which names no address to dial.
	Advertise string
	// Etcd lists the coordinator's endpoints; EtcdTLS, if set, is how to
	// reach an etcd that serves TLS (its CA, and this node's client
	// certificate if etcd asks for one), EtcdUser and EtcdPassword its
	// credentials if etcd has auth enabled. Whoever writes to etcd
	// controls placement, addresses and claims (docs/DESIGN.md "Who may
	// talk to a node").
	Etcd                   []string
	EtcdTLS                *tls.Config
	EtcdUser, EtcdPassword string
	// EtcdTimeout bounds each wait on etcd before the node is ready
	// (reading the layout and the placement, registering); one that
	// expires fails Run with the step named. Default EtcdTimeoutDefault.
	EtcdTimeout time.Duration
	// DataDir holds the node's durable record (pebble).
	DataDir string
	// NodeTTL is the node's lease TTL in etcd (whole seconds, default 4 s):
	// a dead node is noticed within about this long.
	NodeTTL time.Duration
	// ClaimTTL is a rejoin claim's lease TTL (default 5 s), ClaimWindow how
	// often a claim holder re-checks it (default 2 s). The lease guard
	// (claim.Held) allows a keepalive to lag TTL/2 and a check a window:
	// on a machine busy with the rejoin itself, tighter values stop
	// healthy attempts.
	ClaimTTL, ClaimWindow time.Duration
	// IncomingMax bounds the rejoins this node runs as destination at once
	// (the per-node limit); OutgoingMax those it serves as source.
	IncomingMax, OutgoingMax int
	// ApplyMax bounds the rejoin blocks the node applies at once as a
	// destination, across all its rejoins (default GOMAXPROCS-1, at least
	// 1): the cores left over run its live replicas' txns, its feeds and
	// its network poller, which a node applying on every core starves
	// for up to the scheduler's 10 ms slice (docs/DESIGN.md "The rejoin
	// takes what the writes leave").
	ApplyMax int
	// Codec compresses the node's frames (rejoin blocks above all).
	Codec wire.Codec
	// RateBytesPerSec limits each rejoin stream's sending (0: none).
	RateBytesPerSec int64
	// CallWait bounds how long a call sequenced here waits for its
	// replicas' results (default CallWaitDefault): past it the caller is
	// answered as of unknown outcome, naming the replicas that did not
	// answer, and the node logs it. Every other rule ends a wait on a
	// replica that will not answer well before (a dead node, a replica no
	// longer live, a feed not taken up); this bound answers the caller
	// should one of them fail. It is counted in BeatEvery ticks, at least
	// one.
	CallWait time.Duration
	// BeatEvery is how often the initiator sends a heartbeat on an idle
	// feed (default 2 ms).
	BeatEvery time.Duration
	// PaceTarget: while a source ships its snapshot, its link is slowed
	// whenever more than one txn of the partition in 50 waited longer
	// than this from its feed to its Done at the source replica, and
	// sped up again when few do (default 2 ms; negative: never paced;
	// docs/DESIGN.md "The rejoin takes what the writes leave").
	PaceTarget time.Duration
	// BeatLead is how far ahead of its clock the heartbeats of an
	// initiator that has sequenced no txn for beatLeadQuiet stand
	// (default 100 ms; negative: never ahead): a node that writes then
	// finds the other initiators already past its txns and waits for no
	// heartbeat of theirs while their heartbeats are late by less than
	// that, as those of a node busy rejoining are (docs/DESIGN.md
	// "Heartbeats that lead").
	BeatLead time.Duration
	// ConnsMax bounds the connections the node serves past their hello,
	// of every kind (default 256). One past it gets a wire.Reply saying
	// so and is closed; the others are served on. NodeConnsReserved of
	// them (default ConnsMax/4; negative: none) only node certificates
	// may take: clients filling theirs lock no feed, rejoin or repair
	// out. On an insecure node, a hello's kind says which it is.
	ConnsMax, NodeConnsReserved int
	// HandshakesMax bounds the accepted connections that have not yet
	// finished TLS and their hello (default 128), HandshakesPerSourceMax
	// those of one source IP address (default 32). They hold no slot of
	// ConnsMax. Past either bound the oldest of them (of that source)
	// that has sent nothing, or else the oldest, is closed for the new
	// one: a flood of silent connections costs each of its own a
	// shorter life and never locks a dialler that speaks out
	// (docs/DESIGN.md "Who may talk to a node").
	HandshakesMax, HandshakesPerSourceMax int
	// HelloTimeout bounds how long an accepted connection may take to
	// finish TLS and send its Hello, and the node to write its answer
	// (default 5 s). A rejoin hello's answer waits for a read of the
	// task's claim in etcd (up to 2 s), so a value below that refuses
	// rejoins when etcd is slow.
	HelloTimeout time.Duration
	// ClientIdleTimeout closes a client connection that sent no call for
	// this long and has none in flight (default 5 min; negative: never),
	// so clients that leave connections open do not hold ConnsMax's
	// slots for good. The Go client dials again at its next call.
	ClientIdleTimeout time.Duration
	// ClientBytesMax bounds the calls one client connection has in flight,
	// in bytes: each call's params and procedure name plus a fixed
	// overhead, and its reply once queued, until the reply is written
	// (default 4 MiB, one call of wire.ProcTupleBytesMax). Past it the
	// node stops reading the connection until replies drain: TCP passes
	// the back-pressure on to the client, whose calls all get answered.
	ClientBytesMax int64
	// RejoinBufferBytesMax bounds the txns a rejoining replica buffers
	// until its handoff, in bytes (default recovery.BufferBytesMaxDefault,
	// 512 MiB); past half of it the source holds the partition's
	// execution (wire.Hold) until the handoff. A node buffers for at most
	// IncomingMax rejoins at once.
	RejoinBufferBytesMax int64
	// TLS are the node's credentials (its certificate names node n<ID>):
	// every connection it accepts or dials is mutual TLS 1.3 from the
	// cluster CA, and what a dialler may do is what its certificate names
	// (docs/DESIGN.md "Who may talk to a node"). Nil is refused unless
	// Insecure is set.
	TLS *certs.TLS
	// Insecure runs the node without TLS: anyone who reaches its port may
	// do anything. It is said loudly in the log and in /status.
	Insecure bool
	// ReplaceRunning lets this process take over from a live process of
	// the same id registered in etcd (`--replace-running`): without it the
	// node refuses to start, since the other process, superseded, would
	// stop.
	ReplaceRunning bool
	// FaultPoints serves POST /fault/{hold,release,cut-link,pause-holder}
	// on the admin HTTP (the demo and the tests); Pprof serves
	// /debug/pprof/. Neither is routed otherwise (404).
	FaultPoints, Pprof bool
	Log                *slog.Logger
	// PlantDropKey is a test-only planted fault (`rejoin chaos --plant`,
	// which checks that its checker catches a lost write): this node's
	// initiator turns its first upsert of this key of any table into an
	// upsert of the key with "~planted" appended, and acknowledges it.
	// Empty: off.
	PlantDropKey string

	// knobs are the hooks and overrides only tests set (a zero value:
	// none), kept apart from what an operator configures.
	knobs testingKnobs
}

// staleAfter is the health task's limit for a running task whose record
// its claim holder has not refreshed: the source's stall window (an attempt
// that makes no progress for it aborts by itself) plus two claim windows
// (it refreshes the record on progress at most once a window), so a
// rejoin that makes progress is never reset, however long it takes.
func (c *Config) staleAfter() time.Duration {
	if c.knobs.staleAfter > 0 {
		return c.knobs.staleAfter
	}
	return time.Duration(c.sourceStallTicks())*tickEvery + 2*c.ClaimWindow
}

func (c *Config) sourceStallTicks() int {
	if c.knobs.sourceStallTicks > 0 {
		return c.knobs.sourceStallTicks
	}
	return stallTicks
}

// Defaults of Config's limits.
const (
	ConnsMaxDefault               = 256
	HandshakesMaxDefault          = 128
	HandshakesPerSourceMaxDefault = 32
	HelloTimeoutDefault           = 5 * time.Second
	ClientIdleTimeoutDefault      = 5 * time.Minute
	ClientBytesMaxDefault         = 4 << 20
)

// EtcdTimeoutDefault is Config.EtcdTimeout's default.
const EtcdTimeoutDefault = 10 * time.Second

// clusterWaitMax bounds the wait for a cluster layout to be written, when
// etcd answers that there is none yet.
const clusterWaitMax = 30 * time.Second

// NodeName is the id of node number n.
func NodeName(n int) string { return fmt.Sprintf("n%d", n) }

func (c *Config) defaults() error {
	if c.ID < 1 || c.ID >= int(txnid.InitiatorsMax) {
		return fmt.Errorf("%w: --id %d, want 1..%d", ErrConfig, c.ID, txnid.InitiatorsMax-1)
	}
	if len(c.Etcd) == 0 {
		return fmt.Errorf("%w: no etcd endpoints", ErrConfig)
	}
	if c.DataDir == "" {
		return fmt.Errorf("%w: no data directory", ErrConfig)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.EtcdTimeout, EtcdTimeoutDefault)
	if c.EtcdTimeout < 0 {
		return fmt.Errorf("%w: etcd timeout %s", ErrConfig, c.EtcdTimeout)
	}
	def(&c.NodeTTL, 4*time.Second)
	def(&c.ClaimTTL, 5*time.Second)
	def(&c.ClaimWindow, 2*time.Second)
	def(&c.BeatEvery, 2*time.Millisecond)
	def(&c.CallWait, CallWaitDefault)
	if c.CallWait < 0 {
		return fmt.Errorf("%w: call wait %s", ErrConfig, c.CallWait)
	}
	def(&c.BeatLead, 100*time.Millisecond)
	def(&c.PaceTarget, 2*time.Millisecond)
	switch {
	case c.TLS == nil && !c.Insecure:
		return fmt.Errorf("%w: no certificates: give the node its certificates (--certs-dir; `rejoin cert` makes them), or run it with --insecure, which lets anyone who reaches its port do anything", ErrConfig)
	case c.TLS != nil && c.Insecure:
		return fmt.Errorf("%w: certificates and --insecure both given", ErrConfig)
	case c.TLS != nil && c.TLS.Identity() != certs.NodeID(c.ID):
		return fmt.Errorf("%w: the certificate is %s's, not node %s's", ErrConfig, c.TLS.Identity(), NodeName(c.ID))
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.HTTP == "" {
		c.HTTP = "127.0.0.1:0"
	}
	for _, a := range []struct{ flag, addr string }{{"--listen", c.Listen}, {"--http", c.HTTP}} {
		if isWildcard(a.addr) && c.Advertise == "" {
			return fmt.Errorf("%w: %s %s is a wildcard address, which peers cannot dial: give --advertise HOST[:PORT], the address they reach this node at", ErrConfig, a.flag, a.addr)
		}
	}
	if c.Advertise != "" {
		if !advertiseOK(c.Advertise) {
			return fmt.Errorf("%w: --advertise %q: want HOST or HOST:PORT, a host name or IP address that peers and clients dial", ErrConfig, c.Advertise)
		}
		if isWildcard(c.Advertise) {
			return fmt.Errorf("%w: --advertise %s is a wildcard address: give one peers can dial", ErrConfig, c.Advertise)
		}
	}
	if c.IncomingMax == 0 {
		c.IncomingMax = 2
	}
	if c.OutgoingMax == 0 {
		c.OutgoingMax = 2
	}
	if c.ApplyMax == 0 {
		c.ApplyMax = max(1, runtime.GOMAXPROCS(0)-1)
	}
	if c.ConnsMax == 0 {
		c.ConnsMax = ConnsMaxDefault
	}
	switch {
	case c.NodeConnsReserved == 0:
		c.NodeConnsReserved = c.ConnsMax / 4
	case c.NodeConnsReserved < 0:
		c.NodeConnsReserved = 0 // none: clients may take every slot
	}
	if c.HandshakesMax == 0 {
		c.HandshakesMax = HandshakesMaxDefault
	}
	if c.HandshakesPerSourceMax == 0 {
		c.HandshakesPerSourceMax = min(HandshakesPerSourceMaxDefault, c.HandshakesMax)
	}
	def(&c.HelloTimeout, HelloTimeoutDefault)
	def(&c.ClientIdleTimeout, ClientIdleTimeoutDefault)
	if c.ClientBytesMax == 0 {
		c.ClientBytesMax = ClientBytesMaxDefault
	}
	if c.RejoinBufferBytesMax == 0 {
		c.RejoinBufferBytesMax = recovery.BufferBytesMaxDefault
	}
	switch {
	case c.RejoinBufferBytesMax < 2:
		return fmt.Errorf("%w: RejoinBufferBytesMax %d, want >= 2", ErrConfig, c.RejoinBufferBytesMax)
	case c.ApplyMax < 1:
		return fmt.Errorf("%w: ApplyMax %d, want >= 1", ErrConfig, c.ApplyMax)
	case c.ConnsMax < 1:
		return fmt.Errorf("%w: ConnsMax %d, want >= 1", ErrConfig, c.ConnsMax)
	case c.NodeConnsReserved >= c.ConnsMax:
		return fmt.Errorf("%w: NodeConnsReserved %d of ConnsMax %d leaves clients no slot", ErrConfig, c.NodeConnsReserved, c.ConnsMax)
	case c.HandshakesMax < 1 || c.HandshakesPerSourceMax < 1 || c.HandshakesPerSourceMax > c.HandshakesMax:
		return fmt.Errorf("%w: HandshakesMax %d, HandshakesPerSourceMax %d: want 1 <= per source <= max", ErrConfig, c.HandshakesMax, c.HandshakesPerSourceMax)
	case c.HelloTimeout < 0:
		return fmt.Errorf("%w: HelloTimeout %v, want > 0", ErrConfig, c.HelloTimeout)
	case c.ClientBytesMax < clientCallOverheadBytes:
		return fmt.Errorf("%w: ClientBytesMax %d, want >= %d", ErrConfig, c.ClientBytesMax, clientCallOverheadBytes)
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// isWildcard reports whether addr (host:port, or a bare host) names no
// one host: an empty host or an unspecified IP.
func isWildcard(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsUnspecified()
}

// advertised is what to register for bound, the address a listener of
// cfgAddr (Listen or HTTP) got: bound itself, unless Advertise is set and
// either this is the node's port (Listen) or cfgAddr is a wildcard. The
// port is Advertise's if it names one and this is Listen, else bound's.
func (c *Config) advertised(cfgAddr, bound string, isListen bool) string {
	if c.Advertise == "" || (!isListen && !isWildcard(cfgAddr)) {
		return bound
	}
	host, port, err := net.SplitHostPort(c.Advertise)
	if err != nil {
		host, port = strings.Trim(c.Advertise, "[]"), ""
	}
	if port == "" || !isListen {
		_, port, _ = net.SplitHostPort(bound)
	}
	return net.JoinHostPort(host, port)
}

// advertiseOK reports whether a is HOST or HOST:PORT with an IP address
// or a DNS name (letters, digits, hyphens and dots) and a port 1..65535:
// the node registers it for every peer to dial, and one with a space
// started a node no peer could reach.
func advertiseOK(a string) bool {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		if strings.Contains(a, ":") && net.ParseIP(a) == nil {
			return false
		}
		host, port = a, ""
	}
	if err == nil || port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return false
		}
	}
	if net.ParseIP(host) != nil {
		return true
	}
	if host == "" || len(host) > 253 {
		return false
	}
	for _, r := range host {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

// Addrs are where a running node listens, known once Run has bound them.
type Addrs struct {
	Node, TCP, HTTP string
}

// testingKnobs are the tests' hooks into a node and their overrides of
// its timing. Nothing outside this package's tests sets them; each is off
// at its zero value.
type testingKnobs struct {
	// clientBytes sees the bytes a client connection has
	// in flight each time they grow, and the calls read from it so far.
	clientBytes func(inflight int64, calls int)
	// skip keeps the initiator from sending txn id to
	// node: a node that died half way through sending it.
	skip func(node string, id txnid.ID) bool
	// beforeRegister holds the start this long between
	// recording the incarnation and registering.
	beforeRegister time.Duration
	// crash stops the node without a goodbye, to etcd or to its
	// callers (no drain of the calls): its record stays until its lease
	// ends, it is fenced, or a newer process of the node takes it over,
	// as after a SIGKILL.
	crash bool
	// noTasks keeps the node from opening rejoin tasks:
	// its replicas that need a rejoin stay so.
	noTasks bool
	// clock is the initiator's clock (Unix milliseconds):
	// one that runs behind the other nodes'.
	clock func() int64
	// noFeedTo keeps the initiator's feed to node from
	// opening as a dial that fails every time.
	noFeedTo func(node string) bool
	// feedOpen hears of each feed this node's initiator
	// opened (its floor in), by the node it goes to.
	feedOpen func(node string)
	// loseFloor, when it returns true for a feed's node, breaks
	// the connection once the receiver's first answer came in,
	// unread: as a reset between the receiver's send and the
	// initiator's read does.
	loseFloor func(node string) bool
	// repairDelay holds each repair answer this long: a
	// repair still under way when the dead initiator's node is back.
	repairDelay time.Duration
	// repairRetryMax replaces the longest pause between two asks
	// of a peer a repair cannot reach (default repairRetryMax).
	repairRetryMax time.Duration
	// feedDialWait replaces the bound of a feed's dial and hello
	// (default feedDialWait).
	feedDialWait time.Duration
	// handoff gets a copy of every Handoff this node sends
	// as a source, with the attempt's epoch, and returns what to send
	// instead: nil loses it, a changed digest corrupts it.
	handoff func(epoch uint64, h *wire.Handoff) *wire.Handoff
	// loseHandoffAck loses every HandoffAck this node
	// sends as a destination.
	loseHandoffAck bool
	// staleAfter replaces the stale limit of running tasks
	// this node's supervisor resets (default staleAfter).
	staleAfter time.Duration
	// applying is called for each rejoin block this node
	// applies as a destination, with its apply slot held (applySlots).
	applying func(p uint32)
	// adminTLS serves the admin HTTP as if off loopback.
	adminTLS bool
	// sourceStallTicks replaces the stall window of this
	// node's source attempts (default stallTicks).
	sourceStallTicks int
	// completeFails fails this many of a live
	// destination's first tries at completing its task, as an etcd outage
	// through the handoff would.
	completeFails int
	// peerAddr replaces the address this node dials node at (its
	// registered one, addr): a proxy of this node's own in front of the
	// peer, which a test freezes to cut this node off from its peers
	// without cutting them off from each other.
	peerAddr func(node, addr string) string
	// noReachGate lets a new process register without reaching its
	// peers first (reachPeers): for tests of a process registered while
	// cut off, as one cut off right after it reached its peers is.
	noReachGate bool
	// noCutFence turns off the fences for a cut between two nodes
	// (supervise.CutDue) and the registration gate's wait for such a cut
	// to heal: for tests of what a cut left standing does, which the
	// cut's fence would otherwise end within seconds.
	noCutFence bool
	// listener wraps the node's TCP listener: one whose Accept fails
	// now and then, as it does when the process runs out of descriptors.
	listener func(net.Listener) net.Listener
	// adminConnsMax and adminTimeout replace the admin HTTP's connection
	// cap and its read-header and idle timeouts.
	adminConnsMax int
	adminTimeout  time.Duration
}
