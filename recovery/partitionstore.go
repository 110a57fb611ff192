package recovery

import (
	"github.com/rejoin-db/rejoin/cow"
	"github.com/rejoin-db/rejoin/partition"
)

// PartitionStore is the store seams (SourceStore, DestinationStore) over
// package partition and cow: the replica is a partition.Executor and the
// partition it runs on, streamed by a cow.Stream and rebuilt by a
// cow.Applier. NewSource and NewDestination wrap their executor in one.
type PartitionStore struct {
	*partition.Executor
	applier cow.Applier // scratch space reused across blocks
}

var (
	_ SourceStore      = (*PartitionStore)(nil)
	_ DestinationStore = (*PartitionStore)(nil)
	_ TableStream      = (*cow.Stream)(nil)
)

// NewPartitionStore returns the store seams over exec and its partition.
func NewPartitionStore(exec *partition.Executor) *PartitionStore {
	return &PartitionStore{Executor: exec}
}

// Activate implements SourceStore: a cow.Stream on the partition.
func (ps *PartitionStore) Activate(cfg cow.Config) (TableStream, error) {
	st, err := cow.Activate(ps.Partition(), cfg)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// Apply implements DestinationStore with cow's Applier, which checks the
// whole block before it writes any of it.
func (ps *PartitionStore) Apply(b cow.Block) error {
	return ps.applier.Apply(ps.Partition(), b)
}

// Clear implements DestinationStore: every table is emptied, its schema
// kept.
func (ps *PartitionStore) Clear() { ps.Partition().Clear() }

// Reserve implements DestinationStore: a partition of one table sizes it
// for rows (partition.Table.Reserve, which bounds it). With several
// tables the count does not say how the rows split, so none is sized and
// each grows as its rows come.
func (ps *PartitionStore) Reserve(rows uint64) {
	tables := ps.Partition().Tables()
	if len(tables) == 1 {
		tables[0].Reserve(int(min(rows, partition.ReserveRowsMax)))
	}
}

// Digest implements SourceStore and DestinationStore: the partition's
// order-independent digest.
func (ps *PartitionStore) Digest() uint64 { return ps.Partition().Digest() }

// Rows implements SourceStore and DestinationStore: the rows of every
// table.
func (ps *PartitionStore) Rows() uint64 {
	var rows uint64
	for _, t := range ps.Partition().Tables() {
		rows += uint64(t.Len())
	}
	return rows
}
