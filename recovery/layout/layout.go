package layout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rejoin-db/rejoin/partition"
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

// Init writes cfg and the placement of its partitions' replicas on
// nodes (supervise.Place), in one transaction that fails with ErrExists if
// a cluster is already there. Every replica starts live: the cluster is
// empty, so every copy is trivially equal.
func Init(ctx context.Context, cli *clientv3.Client, cfg Config, nodes []string) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	place, err := supervise.Place(nodes, cfg.Partitions, cfg.Replicas)
	if err != nil {
		return err
	}
	val, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	ops := []clientv3.Op{clientv3.OpPut(Key, string(val))}
	for p, ns := range place {
		for _, n := range ns {
			rv, _ := json.Marshal(supervise.Replica{State: supervise.ReplicaLive})
			ops = append(ops, clientv3.OpPut(supervise.ReplicaKey(p, n), string(rv)))
		}
	}
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(Key), "=", 0)).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("layout: init: %w", err)
	}
	if !resp.Succeeded {
		return ErrExists
	}
	return nil
}

// Read reads the cluster's config.
func Read(ctx context.Context, cli *clientv3.Client) (Config, error) {
	resp, err := cli.Get(ctx, Key)
	if err != nil {
		return Config{}, fmt.Errorf("layout: read: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return Config{}, ErrMissing
	}
	return parse(resp.Kvs[0].Value)
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
