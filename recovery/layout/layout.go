package layout

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/recovery"
	"github.com/rejoin-db/rejoin/recovery/supervise"
	"github.com/rejoin-db/rejoin/wire"
)

// Key holds the cluster's Config, written once.
const Key = "/rejoin/cluster"

// Errors of the package, classified with errors.Is.
var (
	// ErrConfig: a cluster setting out of range.
	ErrConfig = errors.New("layout: bad config")
	// ErrMissing: /rejoin/cluster is not there (Init first).
	ErrMissing = errors.New("layout: cluster not initialised")
	// ErrExists: Init found a cluster already there.
	ErrExists = errors.New("layout: cluster already initialised")
)

// Config is the cluster's shape: how many partitions, how many
// replicas of each, and the tables every partition holds.
type Config struct {
	Partitions uint32  `json:"partitions"`
	Replicas   int     `json:"replicas"`
	Tables     []Table `json:"tables"`
}

// Table is a table's schema as stored in etcd.
type Table struct {
	Name    string   `json:"name"`
	Columns []Column `json:"columns"`
	Key     []int    `json:"key"`
}

// Column is one column; Type is wire.Type's name (int64, float64,
// string, bytes).
type Column struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// KV is the demo's table: a bytes key and a bytes value.
func KV() Table {
	return Table{Name: "kv", Columns: []Column{{Name: "k", Type: "bytes"}, {Name: "v", Type: "bytes"}}, Key: []int{0}}
}

// Schema converts the spec to a partition.Schema.
func (t Table) Schema() (partition.Schema, error) {
	s := partition.Schema{Name: t.Name, Key: t.Key}
	for _, c := range t.Columns {
		typ, err := parseType(c.Type)
		if err != nil {
			return partition.Schema{}, fmt.Errorf("%w: table %q column %q: %w", ErrConfig, t.Name, c.Name, err)
		}
		s.Columns = append(s.Columns, partition.Column{Name: c.Name, Type: typ})
	}
	if err := s.Validate(); err != nil {
		return partition.Schema{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return s, nil
}

func parseType(name string) (wire.Type, error) {
	for _, t := range []wire.Type{wire.TypeInt64, wire.TypeFloat64, wire.TypeString, wire.TypeBytes} {
		if t.String() == name {
			return t, nil
		}
	}
	return 0, fmt.Errorf("unknown column type %q", name)
}

// Validate checks the shape.
func (c Config) Validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > 1<<16:
		return fmt.Errorf("%w: %d partitions, want 1..65536", ErrConfig, c.Partitions)
	case c.Replicas < 1 || c.Replicas > 16:
		return fmt.Errorf("%w: %d replicas, want 1..16", ErrConfig, c.Replicas)
	case len(c.Tables) == 0:
		return fmt.Errorf("%w: no tables", ErrConfig)
	}
	for _, t := range c.Tables {
		if _, err := t.Schema(); err != nil {
			return err
		}
	}
	return nil
}

// InitKey is held while an Init is under way: its value is the token of
// the one Init that may still write. It is deleted in the transaction that
// writes Key, so it outlives only an interrupted Init, which the next Init
// takes over.
const InitKey = "/rejoin/init"

// InitTxnOpsMax bounds the puts of one of Init's transactions, well under
// etcd's default --max-txn-ops of 128.
const InitTxnOpsMax = 64

// ErrTakenOver: another Init took this one's place while it wrote; the
// cluster is the other's to finish.
var ErrTakenOver = errors.New("layout: init: another init took over")

// ErrStale: etcd holds records of another cluster's nodes with no cluster
// record; a cluster created over them would take them for its own.
var ErrStale = errors.New("layout: etcd holds another cluster's node records")

// Init creates the cluster: cfg, and the placement of its partitions'
// replicas on nodes (supervise.Place), every replica live (the cluster is
// empty, so every copy is trivially equal). It fails with ErrExists if a
// cluster is already there.
//
// The placement grows with partitions x replicas, past what one etcd
// transaction may carry, so Init writes it in transactions of at most
// InitTxnOpsMax puts and Key last: a reader that finds Key finds the whole
// placement (etcd is linearizable), and one that does not finds no
// cluster (ErrMissing), never half of one. Init first takes InitKey with a
// fresh token, clearing any placement an interrupted Init left, and every
// later write is conditional on that token and on Key being absent: two
// Inits at once cannot mix their placements, and an interrupted one is
// simply run again.
func Init(ctx context.Context, cli *clientv3.Client, cfg Config, nodes []string) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	place, err := supervise.Place(nodes, cfg.Partitions, cfg.Replicas)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	val, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	rv, err := json.Marshal(supervise.Replica{State: recovery.ReplicaLive})
	if err != nil {
		return err
	}
	token := rand.Text()
	absent := clientv3.Compare(clientv3.CreateRevision(Key), "=", 0)
	noNodes := clientv3.Compare(clientv3.CreateRevision(supervise.IncarnationsPrefix), "=", 0).WithPrefix()
	resp, err := cli.Txn(ctx).If(absent, noNodes).Then(
		clientv3.OpPut(InitKey, token),
		clientv3.OpDelete(supervise.ReplicasPrefix, clientv3.WithPrefix()),
		clientv3.OpDelete(supervise.BootstrappedKey),
	).Commit()
	if err != nil {
		return fmt.Errorf("layout: init: %w", err)
	}
	if !resp.Succeeded {
		return initRefused(ctx, cli)
	}
	ours := clientv3.Compare(clientv3.Value(InitKey), "=", token)
	ops := make([]clientv3.Op, 0, InitTxnOpsMax)
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		resp, err := cli.Txn(ctx).If(absent, ours).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("layout: init: write placement: %w", err)
		}
		if !resp.Succeeded {
			return initLost(ctx, cli)
		}
		ops = ops[:0]
		return nil
	}
	for p := range cfg.Partitions {
		for _, n := range place[p] {
			ops = append(ops, clientv3.OpPut(supervise.ReplicaKey(p, n), string(rv)))
			if len(ops) == InitTxnOpsMax {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	resp, err = cli.Txn(ctx).If(absent, ours).Then(clientv3.OpPut(Key, string(val)), clientv3.OpDelete(InitKey)).Commit()
	if err != nil {
		return fmt.Errorf("layout: init: write %s: %w", Key, err)
	}
	if !resp.Succeeded {
		return initLost(ctx, cli)
	}
	return nil
}

// initRefused says why Init could not start: a cluster is there, or
// another cluster's node records are.
func initRefused(ctx context.Context, cli *clientv3.Client) error {
	resp, err := cli.Get(ctx, Key, clientv3.WithCountOnly())
	switch {
	case err != nil:
		return fmt.Errorf("layout: init: %w", err)
	case resp.Count > 0:
		return ErrExists
	}
	return fmt.Errorf("%w (under %s) but no %s: remove what is left of that cluster first (etcdctl del --prefix /rejoin/)", ErrStale, supervise.IncarnationsPrefix, Key)
}

// initLost says why a write of Init failed its compare: another Init
// finished, or took over.
func initLost(ctx context.Context, cli *clientv3.Client) error {
	resp, err := cli.Get(ctx, Key, clientv3.WithCountOnly())
	switch {
	case err != nil:
		return fmt.Errorf("layout: init: %w", err)
	case resp.Count > 0:
		return ErrExists
	}
	return ErrTakenOver
}

// Read reads the cluster's config.
//
// Without one, ErrMissing says whether an Init is under way (or was
// interrupted).
func Read(ctx context.Context, cli *clientv3.Client) (Config, error) {
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(Key), clientv3.OpGet(InitKey, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return Config{}, fmt.Errorf("layout: read: %w", err)
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		return parse(kvs[0].Value)
	}
	if resp.Responses[1].GetResponseRange().Count > 0 {
		return Config{}, fmt.Errorf("%w: an init is under way, or was interrupted (run it again)", ErrMissing)
	}
	return Config{}, ErrMissing
}

// parse decodes and validates the value stored under Key. A config that
// does not validate is returned as the zero Config, so none escapes with
// its error.
func parse(b []byte) (Config, error) {
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return Config{}, fmt.Errorf("layout: %s: %w", Key, err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// TableOf is the stored form of schema s, the inverse of Table.Schema.
func TableOf(s partition.Schema) Table {
	t := Table{Name: s.Name, Key: s.Key}
	for _, c := range s.Columns {
		t.Columns = append(t.Columns, Column{Name: c.Name, Type: c.Type.String()})
	}
	return t
}

// SequencerOrder returns the holders of partition p (the nodes holding
// one of its replicas, in the placement's order) in the order its calls
// should go to them: the preferred sequencer first, holders[p mod n], then
// the others after it. Every node and client takes the same one, so in a
// steady cluster one initiator sequences each partition, and its replicas
// run its txns without waiting for another initiator's heartbeat; the
// preference spreads the partitions over their holders. Any holder may
// sequence a partition all the same (docs/DESIGN.md "Sequencers per
// partition"): the order only says whom to try first.
func SequencerOrder(p uint32, holders []string) []string {
	n := len(holders)
	out := make([]string, 0, n)
	for i := range n {
		out = append(out, holders[(int(p%uint32(max(n, 1)))+i)%n])
	}
	return out
}
