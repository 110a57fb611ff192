package partition

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/rejoin-db/rejoin/wire"
)

// Errors of procedures, classified with errors.Is. Storage errors
// (ErrDuplicateKey, ErrNoRow, ErrSchema) pass through unchanged.
var (
	ErrUnknownProcedure = errors.New("partition: unknown procedure")
	ErrBadParams        = errors.New("partition: bad procedure parameters")
	ErrConstraint       = errors.New("partition: constraint violated")
)

// Procedure is one kind of transaction. It must be deterministic: its
// effect and result depend only on the partition's content and params, never
// on time, randomness or anything outside, so that every replica executing
// the same txns in the same order ends with the same content. It writes only
// through tx; if it returns an error the caller rolls the whole transaction
// back, so a procedure may fail at any point without cleaning up.
type Procedure func(tx *Txn, params []wire.Value) (result []wire.Value, err error)

// Registry maps procedure names to procedures. Register everything before
// execution starts; a Registry is read-only afterwards and may then be
// shared by several partitions.
type Registry struct {
	procs map[string]Procedure
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{procs: make(map[string]Procedure)} }

// Register adds a procedure under name; a name is taken once.
func (r *Registry) Register(name string, p Procedure) error {
	if name == "" || p == nil {
		return fmt.Errorf("partition: register procedure %q: empty name or nil procedure", name)
	}
	if _, ok := r.procs[name]; ok {
		return fmt.Errorf("partition: procedure %q registered twice", name)
	}
	r.procs[name] = p
	return nil
}

// Lookup returns the procedure registered under name.
func (r *Registry) Lookup(name string) (Procedure, bool) {
	p, ok := r.procs[name]
	return p, ok
}

// Names returns the registered names, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.procs))
	for n := range r.procs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Run executes the procedure name with params (a tuple) as one transaction
// on tx's partition and returns its result as a tuple appended to dst. On
// any error, including a parameter that does not decode, the partition is
// exactly as it was before.
func (r *Registry) Run(tx *Txn, name string, params []byte, dst []byte) ([]byte, error) {
	proc, ok := r.procs[name]
	if !ok {
		return dst, fmt.Errorf("%w: %q", ErrUnknownProcedure, name)
	}
	vals, n, err := wire.DecodeValues(params, tx.row[:0])
	if err != nil {
		return dst, fmt.Errorf("%w: %s: %w", ErrBadParams, name, err)
	}
	if n != len(params) {
		return dst, fmt.Errorf("%w: %s: %d bytes after the parameter tuple", ErrBadParams, name, len(params)-n)
	}
	tx.Begin()
	res, err := proc(tx, vals)
	if err == nil {
		dst, err = tx.enc.AppendTuple(dst, res)
	}
	if err != nil {
		tx.Rollback()
		return dst, fmt.Errorf("%s: %w", name, err)
	}
	tx.Begin() // committed: the undo log is no longer needed
	return dst, nil
}

// The built-in procedures. Every one takes the table name first; keys are
// given as the values of the primary key columns in key order.
const (
	ProcInsert    = "insert"    // table, fields... -> ()
	ProcUpsert    = "upsert"    // table, fields... -> ()
	ProcUpdate    = "update"    // table, fields... -> (); the row with that key must exist
	ProcDelete    = "delete"    // table, key... -> (); the row must exist
	ProcRead      = "read"      // table, key... -> fields...
	ProcIncrement = "increment" // table, column, delta, key... -> (new value)
	ProcTransfer  = "transfer"  // table, column, amount, from key..., to key... -> (from value, to value)
	// ProcUpsertMany upserts n rows in one transaction, all or nothing:
	// table, n (int64, 1..wire.TupleFieldsMax), then the n rows' fields
	// flattened (n times the table's columns) -> ().
	ProcUpsertMany = "upsert_many"
	// ProcDigest reads the partition's digest and row count and changes
	// nothing: () -> (digest as int64 (the uint64's bits), rows over all
	// tables). Run at the same txn ID on every replica, it tells whether
	// they agree.
	ProcDigest = "digest"
)

// NewBuiltinRegistry returns a registry holding the built-in procedures.
func NewBuiltinRegistry() *Registry {
	r := NewRegistry()
	for name, p := range map[string]Procedure{
		ProcInsert:    procInsert,
		ProcUpsert:    procUpsert,
		ProcUpdate:    procUpdate,
		ProcDelete:    procDelete,
		ProcRead:      procRead,
		ProcIncrement: procIncrement,
		ProcTransfer:  procTransfer,

		ProcUpsertMany: procUpsertMany,
		ProcDigest:     procDigest,
	} {
		if err := r.Register(name, p); err != nil {
			panic(err) // the names above are distinct
		}
	}
	return r
}

// tableParam reads the table name in params[0].
func tableParam(tx *Txn, params []wire.Value) (*Table, []wire.Value, error) {
	if len(params) == 0 || params[0].Type != wire.TypeString {
		return nil, nil, fmt.Errorf("%w: first parameter must be the table name", ErrBadParams)
	}
	t, err := tx.Table(params[0].Str)
	if err != nil {
		return nil, nil, err
	}
	return t, params[1:], nil
}

// columnParam reads an int64 column name in p and returns its position.
func columnParam(t *Table, p wire.Value) (int, error) {
	if p.Type != wire.TypeString {
		return 0, fmt.Errorf("%w: column must be named by a string, got %v", ErrBadParams, p.Type)
	}
	s := t.Schema()
	for i, c := range s.Columns {
		if c.Name != p.Str {
			continue
		}
		if c.Type != wire.TypeInt64 {
			return 0, fmt.Errorf("%w: column %q is %v, not int64", ErrBadParams, c.Name, c.Type)
		}
		for _, k := range s.Key {
			if k == i {
				return 0, fmt.Errorf("%w: column %q is part of the primary key", ErrBadParams, c.Name)
			}
		}
		return i, nil
	}
	return 0, fmt.Errorf("%w: table %q has no column %q", ErrBadParams, s.Name, p.Str)
}

// lookupRow finds the live row whose key is key and decodes it into the
// txn's scratch row.
func lookupRow(tx *Txn, t *Table, key []wire.Value) (Slot, []wire.Value, error) {
	s := t.Schema()
	if len(key) != len(s.Key) {
		return 0, nil, fmt.Errorf("%w: table %q key has %d columns, got %d values", ErrBadParams, s.Name, len(s.Key), len(key))
	}
	slot, ok := t.LookupValues(key)
	if !ok {
		return 0, nil, fmt.Errorf("%w: table %q key %v", ErrNoRow, s.Name, key)
	}
	row, err := t.Row(slot, nil)
	if err != nil {
		return 0, nil, err
	}
	return slot, row, nil
}

// keyOf returns the primary key values of row.
func keyOf(t *Table, row []wire.Value) ([]wire.Value, error) {
	s := t.Schema()
	if len(row) != len(s.Columns) {
		return nil, fmt.Errorf("%w: table %q has %d columns, got %d values", ErrSchema, s.Name, len(s.Columns), len(row))
	}
	key := make([]wire.Value, len(s.Key))
	for i, k := range s.Key {
		key[i] = row[k]
	}
	return key, nil
}

func procInsert(tx *Txn, params []wire.Value) ([]wire.Value, error) {
	t, row, err := tableParam(tx, params)
	if err != nil {
		return nil, err
	}
	_, err = tx.Insert(t, row)
	return nil, err
}

// rowParams reads a table name and a whole row, and finds the live row
// with the same primary key, if any.
func rowParams(tx *Txn, params []wire.Value) (t *Table, row []wire.Value, slot Slot, found bool, err error) {
	t, row, err = tableParam(tx, params)
	if err != nil {
		return nil, nil, 0, false, err
	}
	key, err := keyOf(t, row)
	if err != nil {
		return nil, nil, 0, false, err
	}
	slot, found = t.LookupValues(key)
	return t, row, slot, found, nil
}

func procUpsert(tx *Txn, params []wire.Value) ([]wire.Value, error) {
	t, row, slot, found, err := rowParams(tx, params)
	switch {
	case err != nil:
		return nil, err
	case found:
		return nil, tx.Update(t, slot, row)
	}
	_, err = tx.Insert(t, row)
	return nil, err
}

func procUpdate(tx *Txn, params []wire.Value) ([]wire.Value, error) {
	t, row, slot, found, err := rowParams(tx, params)
	switch {
	case err != nil:
		return nil, err
	case !found:
		key, _ := keyOf(t, row)
		return nil, fmt.Errorf("%w: table %q key %v", ErrNoRow, t.Schema().Name, key)
	}
	return nil, tx.Update(t, slot, row)
}

func procDelete(tx *Txn, params []wire.Value) ([]wire.Value, error) {
	t, key, err := tableParam(tx, params)
	if err != nil {
		return nil, err
	}
	slot, _, err := lookupRow(tx, t, key)
	if err != nil {
		return nil, err
	}
	return nil, tx.Delete(t, slot)
}

func procRead(tx *Txn, params []wire.Value) ([]wire.Value, error) {
	t, key, err := tableParam(tx, params)
	if err != nil {
		return nil, err
	}
	_, row, err := lookupRow(tx, t, key)
	return row, err
}

// addChecked adds delta to the int64 column col of the row with key, and
// returns the new value. It refuses overflow and, if floor is set, a result
// below zero.
func addChecked(tx *Txn, t *Table, col int, delta int64, key []wire.Value, floor bool) (int64, error) {
	slot, row, err := lookupRow(tx, t, key)
	if err != nil {
		return 0, err
	}
	old := row[col].Int
	v := old + delta
	if (delta > 0 && v < old) || (delta < 0 && v > old) {
		return 0, fmt.Errorf("%w: %d + %d overflows int64", ErrConstraint, old, delta)
	}
	if floor && v < 0 {
		return 0, fmt.Errorf("%w: %q would go below zero (%d + %d)", ErrConstraint, t.Schema().Columns[col].Name, old, delta)
	}
	row[col] = wire.Int64(v)
	return v, tx.Update(t, slot, row)
}

func procIncrement(tx *Txn, params []wire.Value) ([]wire.Value, error) {
	t, rest, err := tableParam(tx, params)
	if err != nil {
		return nil, err
	}
	if len(rest) < 2 {
		return nil, fmt.Errorf("%w: increment takes table, column, delta, key", ErrBadParams)
	}
	col, err := columnParam(t, rest[0])
	if err != nil {
		return nil, err
	}
	if rest[1].Type != wire.TypeInt64 {
		return nil, fmt.Errorf("%w: delta must be int64, got %v", ErrBadParams, rest[1].Type)
	}
	v, err := addChecked(tx, t, col, rest[1].Int, rest[2:], false)
	if err != nil {
		return nil, err
	}
	return []wire.Value{wire.Int64(v)}, nil
}

// procTransfer moves amount from one row's column to another's. It debits
// first and credits second, so a missing destination row fails after a
// write and exercises rollback; the balance never goes below zero.
func procTransfer(tx *Txn, params []wire.Value) ([]wire.Value, error) {
	t, rest, err := tableParam(tx, params)
	if err != nil {
		return nil, err
	}
	k := len(t.Schema().Key)
	if len(rest) != 2+2*k {
		return nil, fmt.Errorf("%w: transfer takes table, column, amount, from key (%d values), to key (%d values)", ErrBadParams, k, k)
	}
	col, err := columnParam(t, rest[0])
	if err != nil {
		return nil, err
	}
	amount := rest[1]
	if amount.Type != wire.TypeInt64 || amount.Int <= 0 || amount.Int == math.MaxInt64 {
		return nil, fmt.Errorf("%w: amount must be a positive int64, got %v", ErrBadParams, amount)
	}
	from, to := rest[2:2+k], rest[2+k:]
	fromV, err := addChecked(tx, t, col, -amount.Int, from, true)
	if err != nil {
		return nil, err
	}
	toV, err := addChecked(tx, t, col, amount.Int, to, false)
	if err != nil {
		return nil, err
	}
	return []wire.Value{wire.Int64(fromV), wire.Int64(toV)}, nil
}

// procUpsertMany upserts each row in turn; a bad row fails the txn after
// the rows before it were written, and Run rolls them all back.
func procUpsertMany(tx *Txn, params []wire.Value) ([]wire.Value, error) {
	t, rest, err := tableParam(tx, params)
	if err != nil {
		return nil, err
	}
	if len(rest) == 0 || rest[0].Type != wire.TypeInt64 {
		return nil, fmt.Errorf("%w: upsert_many takes table, n, then n rows' fields", ErrBadParams)
	}
	n := rest[0].Int
	s := t.Schema()
	cols := len(s.Columns)
	if n < 1 || n > wire.TupleFieldsMax {
		return nil, fmt.Errorf("%w: upsert_many of %d rows, want 1..%d", ErrBadParams, n, wire.TupleFieldsMax)
	}
	fields := rest[1:]
	if int64(len(fields)) != n*int64(cols) {
		return nil, fmt.Errorf("%w: upsert_many of %d rows of table %q takes %d fields, got %d", ErrBadParams, n, s.Name, n*int64(cols), len(fields))
	}
	key := make([]wire.Value, len(s.Key))
	for i := range int(n) {
		row := fields[i*cols : (i+1)*cols]
		for j, k := range s.Key {
			key[j] = row[k]
		}
		if slot, found := t.LookupValues(key); found {
			err = tx.Update(t, slot, row)
		} else {
			_, err = tx.Insert(t, row)
		}
		if err != nil {
			return nil, fmt.Errorf("row %d: %w", i, err)
		}
	}
	return nil, nil
}

// procDigest returns the partition's digest and its live rows.
func procDigest(tx *Txn, params []wire.Value) ([]wire.Value, error) {
	if len(params) != 0 {
		return nil, fmt.Errorf("%w: digest takes no parameters, got %d", ErrBadParams, len(params))
	}
	p := tx.Partition()
	var rows int64
	for _, t := range p.tables {
		rows += int64(t.Len())
	}
	return []wire.Value{wire.Int64(int64(p.Digest())), wire.Int64(rows)}, nil
}
