package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/node/certs"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// Errors of the client, classified with errors.Is.
var (
	// ErrUncertain: the call was sent but its answer never came (the
	// connection broke, the call timed out, or the client closed): the
	// write may or may not have happened.
	ErrUncertain = errors.New("client: outcome uncertain: the call was sent but not answered, the write may or may not have happened")
	// ErrProcedure: the node answered with an error; the txn did not commit.
	ErrProcedure = errors.New("client: procedure failed")
	// ErrNotFound: a procedure failed because a row it needs is not there
	// (partition.ErrNoRow on the node: a read or a delete of a missing
	// key). Always with ErrProcedure.
	ErrNotFound = errors.New("client: no such row")
	// ErrNoNode: no allowed node could be reached; the call was not sent.
	ErrNoNode = errors.New("client: no reachable node")
	// ErrClosed: the client is closed.
	ErrClosed = errors.New("client: closed")
	// ErrCluster: the cluster configuration is missing or unusable.
	ErrCluster = errors.New("client: bad cluster configuration")
	// ErrProtocol: a node sent something the protocol does not allow.
	ErrProtocol = errors.New("client: protocol error")
	// ErrInvalid: the call cannot be sent as it is (its params over
	// wire.ProcTupleBytesMax, a procedure name over wire.ProcBytesMax);
	// nothing was sent.
	ErrInvalid = errors.New("client: invalid call")
	// ErrRefused: a node refused the call with nothing sequenced
	// (wire.Reply.Refused); always with one of the errors below. A call
	// refused by one node for its own state (not registered, not ready,
	// stopping) is sent to the next; the error comes back, with ErrNoNode,
	// only once every node refused it.
	ErrRefused = errors.New("client: refused")
	// ErrNotRegistered: the node does not hold its registration in etcd.
	ErrNotRegistered = errors.New("the node is not registered in etcd")
	// ErrNotBootstrapped: a node of the cluster's placement has never
	// started; nothing may be written until it has.
	ErrNotBootstrapped = errors.New("the cluster is not bootstrapped yet")
	// ErrNotReady: the node could not send the txn to every replica of
	// its partition in time.
	ErrNotReady = errors.New("the node is not ready for the partition")
	// ErrStopping: the node is stopping.
	ErrStopping = errors.New("the node is stopping")
	// ErrNotHolder: the node holds no replica of the call's partition, and
	// only a node that holds one sequences its txns. The client tries the
	// holders first; this comes back when its placement is stale.
	ErrNotHolder = errors.New("the node holds no replica of the partition")
)

// Defaults of Options.
const (
	PipelineMaxDefault = 256
	TimeoutDefault     = 10 * time.Second
	DialTimeoutDefault = 3 * time.Second
	// UpsertManyRowsMax bounds the rows of one upsert_many call.
	UpsertManyRowsMax = 256
	// fanoutMax bounds the concurrent calls of UpsertMany and Digests.
	fanoutMax = 32
	// backoffMin and backoffMax bound the wait before redialling a node
	// that could not be reached.
	backoffMin = 50 * time.Millisecond
	backoffMax = 2 * time.Second
	// refreshEvery bounds how often the node records are re-read.
	refreshEvery = 250 * time.Millisecond
	// pickRoundsMax bounds the passes over the nodes one call makes
	// before giving up with ErrNoNode (the call's context may end first).
	pickRoundsMax = 4
)

// Options configure Open.
type Options struct {
	// Nodes restricts the client to these node ids; empty means every
	// live node.
	Nodes []string
	// PipelineMax is the most calls in flight on one connection; default
	// PipelineMaxDefault.
	PipelineMax int
	// Timeout bounds each call (from picking a node to the answer);
	// default TimeoutDefault. The caller's context may end it earlier.
	Timeout time.Duration
	// DialTimeout bounds a connection's dial and hello; default
	// DialTimeoutDefault.
	DialTimeout time.Duration
	// Stream configures the connections; the zero value means s2 frames,
	// a 5 s TCP keepalive and no stall window (a client connection may be
	// idle for long).
	Stream *stream.Config
	// TLS are the client's credentials (a client certificate from the
	// cluster CA, `rejoin cert create-client`): each connection is mutual
	// TLS, and the node must present the certificate of the node the
	// client meant. Nil dials in plain TCP, which only a node run with
	// --insecure accepts.
	TLS *certs.TLS
}

// ReplicaResult is one replica's outcome of a CallEach.
type ReplicaResult struct {
	Node string
	Out  []wire.Value
	Err  string
}

// Result is a call's outcome. Its values are the client's own copies.
type Result struct {
	ID   txnid.ID
	Node string // the node that answered
	Out  []wire.Value
	Each []ReplicaResult // CallEach only
}

// Client is a client of a rejoin cluster; safe for concurrent use.
type Client struct {
	etcd       *clientv3.Client
	opts       Options
	streamCfg  stream.Config
	partitions uint32
	tables     []layout.Table

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // reader goroutines

	rr atomic.Uint64

	mu          sync.Mutex
	closed      bool
	nodes       []*node // allowed nodes, id order
	refreshedAt time.Time
	// holders are the nodes holding a replica of each partition, as the
	// placement said at the last refresh: a call goes to them first.
	holders map[uint32][]string
}

// Open reads the cluster configuration and the live nodes from etcd. It
// does not connect yet: the first call to a node dials it.
func Open(ctx context.Context, cli *clientv3.Client, opts Options) (*Client, error) {
	if opts.PipelineMax <= 0 {
		opts.PipelineMax = PipelineMaxDefault
	}
	if opts.Timeout <= 0 {
		opts.Timeout = TimeoutDefault
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = DialTimeoutDefault
	}
	opts.Nodes = slices.Clone(opts.Nodes)
	scfg := stream.Config{Codec: wire.CodecS2, KeepAlive: 5 * time.Second}
	if opts.Stream != nil {
		scfg = *opts.Stream
	}
	cfg, err := layout.Read(ctx, cli)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCluster, err)
	}
	c := &Client{etcd: cli, opts: opts, streamCfg: scfg, partitions: cfg.Partitions, tables: cfg.Tables}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if err := c.refresh(ctx); err != nil {
		c.cancel()
		return nil, err
	}
	return c, nil
}

// Partitions is the cluster's partition count.
func (c *Client) Partitions() uint32 { return c.partitions }

// Tables returns the cluster's tables.
func (c *Client) Tables() []layout.Table { return slices.Clone(c.tables) }

// Nodes returns the ids of the allowed nodes the client knows live.
func (c *Client) Nodes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for _, n := range c.nodes {
		if n.live.Load() {
			ids = append(ids, n.id)
		}
	}
	return ids
}

func (c *Client) allowed(id string) bool {
	return len(c.opts.Nodes) == 0 || slices.Contains(c.opts.Nodes, id)
}

// refresh re-reads the node records and the placement: addresses change
// when a node restarts, nodes come and go, replicas move.
func (c *Client) refresh(ctx context.Context) error {
	recs, err := supervise.Nodes(ctx, c.etcd)
	if err != nil {
		return fmt.Errorf("client: read node records: %w", err)
	}
	rs, err := supervise.Replicas(ctx, c.etcd)
	if err != nil {
		return fmt.Errorf("client: read the placement: %w", err)
	}
	holders := map[uint32][]string{}
	for _, r := range rs {
		holders[r.Partition] = append(holders[r.Partition], r.Node)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshedAt = time.Now()
	c.holders = holders
	seen := make(map[string]bool, len(recs))
	for _, r := range recs {
		if !c.allowed(r.ID) || r.Address == "" {
			continue
		}
		seen[r.ID] = true
		i := slices.IndexFunc(c.nodes, func(n *node) bool { return n.id == r.ID })
		if i < 0 {
			n := &node{c: c, id: r.ID, dialSem: make(chan struct{}, 1)}
			n.setAddr(r.Address)
			n.live.Store(true)
			c.nodes = append(c.nodes, n)
			continue
		}
		c.nodes[i].setAddr(r.Address)
		c.nodes[i].live.Store(true)
	}
	for _, n := range c.nodes {
		if !seen[n.id] {
			n.live.Store(false)
		}
	}
	slices.SortFunc(c.nodes, func(a, b *node) int {
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	})
	return nil
}

// maybeRefresh re-reads the node records unless that was done lately.
func (c *Client) maybeRefresh(ctx context.Context) {
	c.mu.Lock()
	due := time.Since(c.refreshedAt) >= refreshEvery
	if due {
		c.refreshedAt = time.Now() // one refresher at a time
	}
	c.mu.Unlock()
	if due {
		_ = c.refresh(ctx) // the old view stays; the call fails on its own
	}
}

// Close closes every connection and ends every goroutine; calls in
// flight fail with ErrClosed (and ErrUncertain if they were sent).
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	nodes := slices.Clone(c.nodes)
	c.mu.Unlock()
	c.cancel()
	for _, n := range nodes {
		n.closeConn()
	}
	c.wg.Wait()
	return nil
}

// Route is the partition of a key given as the values of its key columns.
func (c *Client) Route(key ...wire.Value) (uint32, error) {
	return partition.RouteValues(key, c.partitions)
}

// Partition is Route without the error: a key that cannot be encoded
// (a Value of no valid type) routes to partition 0, where the call then
// fails on the node.
func (c *Client) Partition(key ...wire.Value) uint32 {
	p, err := c.Route(key...)
	if err != nil {
		return 0
	}
	return p
}

// Call runs proc with params as one txn of partition on a node and returns
// its result.
func (c *Client) Call(ctx context.Context, partition uint32, proc string, params []wire.Value) (Result, error) {
	return c.call(ctx, partition, proc, params, false)
}

// CallEach is Call asking for every replica's result in Result.Each (for
// read-only procedures such as digest, which every replica executes at the
// same txn ID).
func (c *Client) CallEach(ctx context.Context, partition uint32, proc string, params []wire.Value) (Result, error) {
	return c.call(ctx, partition, proc, params, true)
}

func (c *Client) call(ctx context.Context, p uint32, proc string, params []wire.Value, each bool) (Result, error) {
	if p >= c.partitions {
		return Result{}, fmt.Errorf("client: partition %d out of [0, %d)", p, c.partitions)
	}
	enc, err := (&wire.TupleEncoder{}).AppendTuple(nil, params)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %s params: %w", ErrInvalid, proc, err)
	}
	// The node's limits, checked here: a frame the encoder refuses would
	// break the connection and make every call on it uncertain.
	switch {
	case len(enc) > wire.ProcTupleBytesMax:
		return Result{}, fmt.Errorf("%w: %s params of %d bytes, over the limit of %d (a row's values together): nothing was sent", ErrInvalid, proc, len(enc), wire.ProcTupleBytesMax)
	case len(proc) > wire.ProcBytesMax:
		return Result{}, fmt.Errorf("%w: procedure name of %d bytes, over the limit of %d: nothing was sent", ErrInvalid, len(proc), wire.ProcBytesMax)
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	call := &wire.Call{Partition: p, Proc: proc, Params: enc, Each: each}
	var lastErr error
	for range pickRoundsMax {
		c.mu.Lock()
		closed, nodes := c.closed, holdersFirst(c.nodes, p, c.holders[p], c.rr.Add(1))
		c.mu.Unlock()
		if closed {
			return Result{}, ErrClosed
		}
		// Round-robin over the live ones, the partition's holders first; a
		// node in backoff is skipped unless nothing else is left.
		var waitUntil time.Time
		tried := false
		for _, n := range nodes {
			if !n.live.Load() {
				continue
			}
			if t, ok := n.backoffUntil(); ok {
				if waitUntil.IsZero() || t.Before(waitUntil) {
					waitUntil = t
				}
				continue
			}
			tried = true
			res, sent, err := n.do(ctx, call)
			if sent && elsewhere(err) {
				// Nothing was sequenced there: the next node may take it.
				lastErr = err
				if errors.Is(err, ErrStopping) {
					n.stopping()
				}
				continue
			}
			if err == nil || sent {
				return res, err
			}
			lastErr = err
			// The node may have moved: read the records again (rate
			// limited), so its next dial goes to its new address.
			c.maybeRefresh(ctx)
			if ctx.Err() != nil {
				return Result{}, fmt.Errorf("client: %s on partition %d not sent: %w", proc, p, lastErr)
			}
		}
		// Nobody answered this round: read the records again (a node may
		// have moved) and wait for the first backoff to end.
		c.maybeRefresh(ctx)
		if !tried && !waitUntil.IsZero() {
			t := time.NewTimer(time.Until(waitUntil))
			select {
			case <-ctx.Done():
				t.Stop()
				if lastErr == nil {
					return Result{}, fmt.Errorf("client: %s on partition %d not sent: %w", proc, p, ctx.Err())
				}
				return Result{}, fmt.Errorf("%w: %s on partition %d: %w (%w)", ErrNoNode, proc, p, lastErr, ctx.Err())
			case <-c.ctx.Done():
				t.Stop()
				return Result{}, ErrClosed
			case <-t.C:
			}
		}
	}
	if lastErr == nil {
		lastErr = errors.New("no live allowed node")
	}
	return Result{}, fmt.Errorf("%w: %s on partition %d: %w", ErrNoNode, proc, p, lastErr)
}

// Holders returns the nodes holding a replica of partition p in the
// order a call of p tries them (layout.SequencerOrder), as of the
// client's last read of the placement.
func (c *Client) Holders(p uint32) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return layout.SequencerOrder(p, c.holders[p])
}

// holdersFirst returns nodes in the order a call of partition p tries
// them: its holders in layout.SequencerOrder (the node that sequences it
// takes the call without a forward, and without a second initiator whose
// heartbeats its replicas would wait for), then the others, rotated by
// start so that calls spread over them.
func holdersFirst(nodes []*node, p uint32, holders []string, start uint64) []*node {
	order := make([]*node, 0, len(nodes))
	for _, h := range layout.SequencerOrder(p, holders) {
		if i := slices.IndexFunc(nodes, func(n *node) bool { return n.id == h }); i >= 0 {
			order = append(order, nodes[i])
		}
	}
	var rest []*node
	for _, n := range nodes {
		if !slices.Contains(holders, n.id) {
			rest = append(rest, n)
		}
	}
	for i := range rest {
		order = append(order, rest[(start+uint64(i))%uint64(len(rest))])
	}
	return order
}

// elsewhere reports whether err is a refusal of the node's own (not of
// the cluster's), which another node may not share.
func elsewhere(err error) bool {
	return errors.Is(err, ErrRefused) && !errors.Is(err, ErrNotBootstrapped)
}

// tableKey returns the key positions of table; the first column when the
// table is unknown.
func (c *Client) tableKey(table string) []int {
	for _, t := range c.tables {
		if t.Name == table && len(t.Key) > 0 {
			return t.Key
		}
	}
	return []int{0}
}

func (c *Client) rowPartition(table string, row []wire.Value) (uint32, error) {
	keyCols := c.tableKey(table)
	key := make([]wire.Value, len(keyCols))
	for i, k := range keyCols {
		if k < 0 || k >= len(row) {
			return 0, fmt.Errorf("client: table %q row of %d values has no key column %d", table, len(row), k)
		}
		key[i] = row[k]
	}
	return c.Route(key...)
}

// Upsert inserts or replaces one row of table (builtin "upsert").
func (c *Client) Upsert(ctx context.Context, table string, row ...wire.Value) (Result, error) {
	p, err := c.rowPartition(table, row)
	if err != nil {
		return Result{}, err
	}
	params := make([]wire.Value, 0, 1+len(row))
	params = append(append(params, wire.String(table)), row...)
	return c.Call(ctx, p, partition.ProcUpsert, params)
}

// Read returns the row of table whose key is key (builtin "read"); a
// missing row is an ErrNotFound error.
func (c *Client) Read(ctx context.Context, table string, key ...wire.Value) ([]wire.Value, error) {
	p, err := c.Route(key...)
	if err != nil {
		return nil, err
	}
	params := make([]wire.Value, 0, 1+len(key))
	params = append(append(params, wire.String(table)), key...)
	res, err := c.Call(ctx, p, partition.ProcRead, params)
	if err != nil {
		return nil, err
	}
	return res.Out, nil
}

// Delete deletes the row of table whose key is key (builtin "delete"); a
// missing row is an ErrNotFound error.
func (c *Client) Delete(ctx context.Context, table string, key ...wire.Value) (Result, error) {
	p, err := c.Route(key...)
	if err != nil {
		return Result{}, err
	}
	params := make([]wire.Value, 0, 1+len(key))
	params = append(append(params, wire.String(table)), key...)
	return c.Call(ctx, p, partition.ProcDelete, params)
}

// Proc names of the cluster builtins the client uses.
const (
	ProcUpsertMany = partition.ProcUpsertMany
	ProcDigest     = partition.ProcDigest
)

// UpsertMany upserts rows into table: grouped by partition, one
// upsert_many txn per partition per chunk of at most UpsertManyRowsMax
// rows, the calls running concurrently (bounded). Every chunk is its own
// txn: on error some chunks may have committed; the error joins every
// chunk's error.
func (c *Client) UpsertMany(ctx context.Context, table string, rows [][]wire.Value) error {
	byPart := make(map[uint32][][]wire.Value)
	for _, r := range rows {
		p, err := c.rowPartition(table, r)
		if err != nil {
			return err
		}
		byPart[p] = append(byPart[p], r)
	}
	type chunk struct {
		p    uint32
		rows [][]wire.Value
	}
	var chunks []chunk
	for p, rs := range byPart {
		per := UpsertManyRowsMax
		if cols := len(rs[0]); cols > 0 {
			per = min(per, (wire.TupleFieldsMax-2)/cols)
		}
		for len(rs) > 0 {
			n := min(per, len(rs))
			chunks = append(chunks, chunk{p, rs[:n]})
			rs = rs[n:]
		}
	}
	errs := make([]error, len(chunks))
	sem := make(chan struct{}, fanoutMax)
	var wg sync.WaitGroup
	for i, ch := range chunks {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			errs[i] = ctx.Err()
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			params := make([]wire.Value, 0, 2+len(ch.rows)*len(ch.rows[0]))
			params = append(params, wire.String(table), wire.Int64(int64(len(ch.rows))))
			for _, r := range ch.rows {
				params = append(params, r...)
			}
			_, errs[i] = c.Call(ctx, ch.p, ProcUpsertMany, params)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Digests calls digest with CallEach on every partition and returns every
// replica's result per partition: Out is (digest int64, rows int64).
func (c *Client) Digests(ctx context.Context) (map[uint32][]ReplicaResult, error) {
	out := make(map[uint32][]ReplicaResult, c.partitions)
	var mu sync.Mutex
	errs := make([]error, c.partitions)
	sem := make(chan struct{}, fanoutMax)
	var wg sync.WaitGroup
	for p := range c.partitions {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			errs[p] = ctx.Err()
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			res, err := c.CallEach(ctx, p, ProcDigest, nil)
			if err != nil {
				errs[p] = fmt.Errorf("partition %d: %w", p, err)
				return
			}
			mu.Lock()
			out[p] = res.Each
			mu.Unlock()
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}
