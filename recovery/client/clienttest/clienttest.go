package clienttest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery/layout"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/stream"
	"github.com/rejoin-db/rejoin/txnid"
	"github.com/rejoin-db/rejoin/wire"
)

// KVSchema is the kv table of the demo and the load generator.
func KVSchema() partition.Schema {
	return partition.Schema{
		Name:    "kv",
		Columns: []partition.Column{{Name: "k", Type: wire.TypeBytes}, {Name: "v", Type: wire.TypeBytes}},
		Key:     []int{0},
	}
}

// Cluster is the data every fake node of it executes on.
type Cluster struct {
	// Replicas names the entries of a CallEach's Reply.Each.
	Replicas []string

	reg   *partition.Registry
	mu    sync.Mutex
	parts []*partition.Partition
	txs   []*partition.Txn
	gen   *txnid.Generator
	out   []byte
}

// NewCluster makes partitions partitions, each holding the tables.
func NewCluster(partitions uint32, tables ...partition.Schema) (*Cluster, error) {
	gen, err := txnid.NewGenerator(1, func() int64 { return time.Now().UnixMilli() })
	if err != nil {
		return nil, err
	}
	c := &Cluster{Replicas: []string{"r1", "r2"}, reg: Registry(), gen: gen}
	for range partitions {
		p := partition.New()
		for _, s := range tables {
			if _, err := p.CreateTable(s); err != nil {
				return nil, err
			}
		}
		c.parts = append(c.parts, p)
		c.txs = append(c.txs, partition.NewTxn(p))
	}
	return c, nil
}

// Registry is the builtin registry (a fallback upsert_many and digest are
// added only if partition lacks them).
func Registry() *partition.Registry {
	reg := partition.NewBuiltinRegistry()
	if _, ok := reg.Lookup("upsert_many"); !ok {
		if err := reg.Register("upsert_many", upsertMany); err != nil {
			panic(err)
		}
	}
	if _, ok := reg.Lookup("digest"); !ok {
		if err := reg.Register("digest", digest); err != nil {
			panic(err)
		}
	}
	return reg
}

func upsertMany(tx *partition.Txn, params []wire.Value) ([]wire.Value, error) {
	if len(params) < 2 || params[0].Type != wire.TypeString || params[1].Type != wire.TypeInt64 {
		return nil, fmt.Errorf("%w: upsert_many takes table, n, rows", partition.ErrBadParams)
	}
	t, err := tx.Table(params[0].Str)
	if err != nil {
		return nil, err
	}
	s := t.Schema()
	n, cols := int(params[1].Int), len(s.Columns)
	rows := params[2:]
	if n < 0 || len(rows) != n*cols {
		return nil, fmt.Errorf("%w: upsert_many of %d rows of %d columns got %d values", partition.ErrBadParams, n, cols, len(rows))
	}
	key := make([]wire.Value, len(s.Key))
	for i := range n {
		row := rows[i*cols : (i+1)*cols]
		for j, k := range s.Key {
			key[j] = row[k]
		}
		if slot, ok := t.LookupValues(key); ok {
			if err := tx.Update(t, slot, row); err != nil {
				return nil, err
			}
			continue
		}
		if _, err := tx.Insert(t, row); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func digest(tx *partition.Txn, params []wire.Value) ([]wire.Value, error) {
	if len(params) != 0 {
		return nil, fmt.Errorf("%w: digest takes no parameters", partition.ErrBadParams)
	}
	p := tx.Partition()
	rows := 0
	for _, t := range p.Tables() {
		rows += t.Len()
	}
	return []wire.Value{wire.Int64(int64(p.Digest())), wire.Int64(int64(rows))}, nil
}

// Exec runs proc on partition p as one txn.
func (c *Cluster) Exec(p uint32, proc string, params []byte) (txnid.ID, []byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int(p) >= len(c.parts) {
		return 0, nil, fmt.Errorf("no partition %d", p)
	}
	id := c.gen.Next()
	out, err := c.reg.Run(c.txs[p], proc, params, c.out[:0])
	c.out = out
	if err != nil {
		return id, nil, err
	}
	return id, append([]byte(nil), out...), nil
}

// Rows returns the rows of table in partition p, decoded.
func (c *Cluster) Rows(p uint32, table string) ([][]wire.Value, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.parts[p].TableByName(table)
	if t == nil {
		return nil, fmt.Errorf("no table %q", table)
	}
	var rows [][]wire.Value
	for s := partition.Slot(0); s < t.SlotsLen(); s++ {
		if !t.Live(s) {
			continue
		}
		r, err := t.Row(s, nil)
		if err != nil {
			return nil, err
		}
		for i := range r {
			if r[i].Type == wire.TypeBytes {
				r[i].Bytes = append([]byte{}, r[i].Bytes...)
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// Action is what a fake node does with a call.
type Action int

const (
	// Answer executes the call and replies (after the hook's delay).
	Answer Action = iota
	// Hang executes the call and never replies.
	Hang
	// DropAfter executes the call, then closes the connection unanswered.
	DropAfter
	// DropBefore closes the connection without executing the call.
	DropBefore
	// Lost executes the call and answers as a node whose replicas were all
	// lost before they answered: Reply.Uncertain with an error.
	Lost
	// Refuse answers with an error without executing the call, as a node
	// that sequences nothing while it is not registered.
	Refuse
)

// Hook picks a node's action for a call and a delay before the reply
// (replies then come out of order). It runs on the connection's reader,
// so it must not block.
type Hook func(node string, call *wire.Call) (Action, time.Duration)

// Node is one fake node listening on loopback.
type Node struct {
	ID      string
	cluster *Cluster
	hook    Hook
	ln      net.Listener
	calls   atomic.Int64

	mu    sync.Mutex
	conns map[*stream.Conn]bool
	wg    sync.WaitGroup
}

// StartNode starts a node of c; hook may be nil (always Answer).
func StartNode(c *Cluster, id string, hook Hook) (*Node, error) {
	ln, err := stream.Listen("")
	if err != nil {
		return nil, err
	}
	n := &Node{ID: id, cluster: c, hook: hook, ln: ln, conns: make(map[*stream.Conn]bool)}
	n.wg.Add(1)
	go n.accept()
	return n, nil
}

// Addr is the node's listen address.
func (n *Node) Addr() string { return n.ln.Addr().String() }

// Calls counts the calls the node received.
func (n *Node) Calls() int64 { return n.calls.Load() }

// DropConns closes every open connection of the node.
func (n *Node) DropConns() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for sc := range n.conns {
		sc.Close()
	}
}

// Close stops the node and waits for its goroutines.
func (n *Node) Close() {
	n.ln.Close()
	n.DropConns()
	n.wg.Wait()
}

func (n *Node) accept() {
	defer n.wg.Done()
	for {
		nc, err := n.ln.Accept()
		if err != nil {
			return
		}
		sc := stream.NewConn(nc, stream.Config{Codec: wire.CodecS2})
		n.mu.Lock()
		n.conns[sc] = true
		n.mu.Unlock()
		n.wg.Add(1)
		go n.serve(sc)
	}
}

func (n *Node) serve(sc *stream.Conn) {
	var replies sync.WaitGroup
	defer n.wg.Done()
	defer replies.Wait()
	defer func() {
		sc.Close()
		n.mu.Lock()
		delete(n.conns, sc)
		n.mu.Unlock()
	}()
	var sendMu sync.Mutex
	ctx := context.Background()
	send := func(m wire.Message) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return sc.Send(ctx, m)
	}
	m, err := sc.Recv()
	if err != nil {
		return
	}
	h, ok := m.(*wire.Hello)
	if !ok || h.Kind != wire.HelloClient {
		_ = send(&wire.Reply{Err: fmt.Sprintf("fake node %s: want a client hello, got %T", n.ID, m)})
		return
	}
	if err := send(&wire.Hello{Kind: wire.HelloClient, Node: n.ID}); err != nil {
		return
	}
	for {
		m, err := sc.Recv()
		if err != nil {
			return
		}
		call, ok := m.(*wire.Call)
		if !ok {
			return
		}
		n.calls.Add(1)
		act, delay := Answer, time.Duration(0)
		if n.hook != nil {
			act, delay = n.hook(n.ID, call)
		}
		if act == DropBefore {
			return
		}
		if act == Refuse {
			if send(&wire.Reply{Req: call.Req, Err: "fake node " + n.ID + " is not registered in etcd (coordinator unreachable)", Refused: wire.RefusedNotRegistered}) != nil {
				return
			}
			continue
		}
		r := n.exec(call)
		switch act {
		case Lost:
			r = &wire.Reply{Req: call.Req, ID: r.ID, Err: "no live replica answered: the txn's outcome is unknown", Uncertain: true}
		case Hang:
			continue
		case DropAfter:
			return
		}
		if delay <= 0 {
			if send(r) != nil {
				return
			}
			continue
		}
		replies.Go(func() {
			t := time.NewTimer(delay)
			defer t.Stop()
			<-t.C
			_ = send(r) // a closed connection fails it
		})
	}
}

func (n *Node) exec(call *wire.Call) *wire.Reply {
	id, out, err := n.cluster.Exec(call.Partition, call.Proc, call.Params)
	r := &wire.Reply{Req: call.Req, ID: id, Out: out, Err: wire.ErrText(err)}
	if call.Each && err == nil {
		for _, name := range n.cluster.Replicas {
			r.Each = append(r.Each, wire.ReplicaOut{Node: name, Out: out})
		}
	}
	return r
}

// WriteCluster writes /rejoin/cluster.
func WriteCluster(ctx context.Context, cli *clientv3.Client, partitions uint32, tables ...partition.Schema) error {
	cfg := layout.Config{Partitions: partitions, Replicas: 2}
	for _, s := range tables {
		cfg.Tables = append(cfg.Tables, layout.TableOf(s))
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	_, err = cli.Put(ctx, layout.Key, string(b))
	return err
}

// RegisterNode writes a node record for id at addr, without a lease.
func RegisterNode(ctx context.Context, cli *clientv3.Client, id, addr string) error {
	b, err := json.Marshal(supervise.NodeRecord{Address: addr, Started: time.Now().UTC(), LastActive: time.Now().UTC(), Status: supervise.NodeReady})
	if err != nil {
		return err
	}
	_, err = cli.Put(ctx, supervise.NodeKey(id), string(b))
	return err
}

// UnregisterNode removes id's node record.
func UnregisterNode(ctx context.Context, cli *clientv3.Client, id string) error {
	resp, err := cli.Delete(ctx, supervise.NodeKey(id))
	if err == nil && resp.Deleted == 0 {
		err = errors.New("no such node record")
	}
	return err
}
