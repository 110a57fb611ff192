package node

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

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
	// Etcd lists the coordinator's endpoints.
	Etcd []string
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
	// often an executor re-checks it (default 2 s). The lease guard
	// (claim.Held) allows a keepalive to lag TTL/2 and a check a window:
	// on a machine busy with the rejoin itself, tighter values stop
	// healthy attempts.
	ClaimTTL, ClaimWindow time.Duration
	// IncomingMax bounds the rejoins this node runs as destination at once
	// (the per-node limit); OutgoingMax those it serves as source.
	IncomingMax, OutgoingMax int
	// Codec compresses the node's frames (rejoin blocks above all).
	Codec wire.Codec
	// RateBytesPerSec limits each rejoin stream's sending (0: none).
	RateBytesPerSec int64
	// BeatEvery is how often the initiator sends a heartbeat on an idle
	// feed (default 2 ms).
	BeatEvery time.Duration
	Log       *slog.Logger

	// testSkip, in tests, keeps the initiator from sending txn id to
	// node: a node that died half way through sending it.
	testSkip func(node string, id txnid.ID) bool
}

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
	if c.Listen == "" {
		c.Listen = "127.0.0.1:0"
	}
	if c.HTTP == "" {
		c.HTTP = "127.0.0.1:0"
	}
	if c.IncomingMax == 0 {
		c.IncomingMax = 2
	}
	if c.OutgoingMax == 0 {
		c.OutgoingMax = 2
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return nil
}

// Addrs are where a running node listens, known once Run has bound them.
type Addrs struct {
	Node, TCP, HTTP string
}
