package partition

import (
	"errors"
	"fmt"

	"github.com/rejoin-db/rejoin/wire"
)

// TableID names a table within a partition. IDs are assigned 1, 2, 3, ... in
// creation order, so replicas that create the same tables in the same order
// agree on them; 0 is never a table.
type TableID uint32

// Column is one column of a table.
type Column struct {
	Name string
	Type wire.Type
}

// Schema describes a table: its name, its columns in tuple order, and its
// primary key as positions into Columns, in key order. A row is stored as
// the canonical tuple of its fields (wire.TupleEncoder); its key is the
// canonical tuple of the key fields (wire.AppendKey), and keys compare and
// hash as bytes.
type Schema struct {
	Name    string
	Columns []Column
	Key     []int
}

// ErrInvalidSchema is wrapped by every error of Schema.Validate.
var ErrInvalidSchema = errors.New("partition: invalid schema")

// Validate checks that the schema can describe a table: a non-empty name,
// 1 to wire.TupleFieldsMax columns with non-empty unique names and known
// types, and a primary key of at least one column, every position in range
// and none repeated.
func (s Schema) Validate() error {
	if s.Name == "" {
		return fmt.Errorf("%w: empty table name", ErrInvalidSchema)
	}
	if len(s.Columns) == 0 || len(s.Columns) > wire.TupleFieldsMax {
		return fmt.Errorf("%w: table %q has %d columns, want 1..%d", ErrInvalidSchema, s.Name, len(s.Columns), wire.TupleFieldsMax)
	}
	names := make(map[string]struct{}, len(s.Columns))
	for i, c := range s.Columns {
		if c.Name == "" {
			return fmt.Errorf("%w: table %q column %d has no name", ErrInvalidSchema, s.Name, i)
		}
		if _, dup := names[c.Name]; dup {
			return fmt.Errorf("%w: table %q has two columns named %q", ErrInvalidSchema, s.Name, c.Name)
		}
		names[c.Name] = struct{}{}
		if !c.Type.Valid() {
			return fmt.Errorf("%w: table %q column %q has %v", ErrInvalidSchema, s.Name, c.Name, c.Type)
		}
	}
	if len(s.Key) == 0 {
		return fmt.Errorf("%w: table %q has no primary key", ErrInvalidSchema, s.Name)
	}
	seen := make([]bool, len(s.Columns))
	for _, k := range s.Key {
		if k < 0 || k >= len(s.Columns) {
			return fmt.Errorf("%w: table %q key column %d out of range [0,%d)", ErrInvalidSchema, s.Name, k, len(s.Columns))
		}
		if seen[k] {
			return fmt.Errorf("%w: table %q key repeats column %d", ErrInvalidSchema, s.Name, k)
		}
		seen[k] = true
	}
	return nil
}

// Types returns the column types in tuple order, in a new slice.
func (s Schema) Types() []wire.Type {
	ts := make([]wire.Type, len(s.Columns))
	for i, c := range s.Columns {
		ts[i] = c.Type
	}
	return ts
}

// clone returns a deep copy, so a table's schema cannot be changed through
// the caller's slices.
func (s Schema) clone() Schema {
	s.Columns = append([]Column(nil), s.Columns...)
	s.Key = append([]int(nil), s.Key...)
	return s
}

// keyIsPrefix reports whether the key columns are the leading columns in
// order (Key == 0, 1, ..., k-1). Then the key fields of a stored tuple are
// one contiguous run right after the tuple header, and the index can hash
// and compare them in place.
func (s Schema) keyIsPrefix() bool {
	for i, k := range s.Key {
		if k != i {
			return false
		}
	}
	return true
}
