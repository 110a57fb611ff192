package partition

import (
	"errors"
	"fmt"
)

// TablesMax bounds the tables of one partition.
const TablesMax = 1 << 16

// ErrTableExists: CreateTable was given a name that is already taken.
var ErrTableExists = errors.New("partition: table exists")

// ErrTooManyTables: the partition already has TablesMax tables.
var ErrTooManyTables = errors.New("partition: too many tables")

// Partition is one replica of one partition: its tables and the observer
// that watches their changes.
//
// A Partition is not safe for concurrent use: its owner, the executor
// goroutine, serialises every call, reads included (a read may use the
// tables' scratch buffers).
type Partition struct {
	// tables holds every table, tables[i] having ID i+1. Tables are never
	// dropped, so IDs are dense.
	tables []*Table
	// byName maps each table's name to it. Invariant: it holds exactly the
	// tables in tables.
	byName map[string]*Table
	// observer, if not nil, is told of every change (see Observer).
	observer Observer
}

// New returns an empty partition.
func New() *Partition {
	return &Partition{byName: make(map[string]*Table)}
}

// CreateTable adds an empty table with schema s and returns it. Tables get
// IDs 1, 2, 3, ... in creation order; the schema is copied.
func (p *Partition) CreateTable(s Schema) (*Table, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if _, ok := p.byName[s.Name]; ok {
		return nil, fmt.Errorf("%w: %q", ErrTableExists, s.Name)
	}
	if len(p.tables) >= TablesMax {
		return nil, fmt.Errorf("%w: %d", ErrTooManyTables, len(p.tables))
	}
	t := newTable(p, TableID(len(p.tables)+1), s)
	p.tables = append(p.tables, t)
	p.byName[s.Name] = t
	return t, nil
}

// Table returns the table with ID id, or nil.
func (p *Partition) Table(id TableID) *Table {
	if id == 0 || int(id) > len(p.tables) {
		return nil
	}
	return p.tables[id-1]
}

// TableByName returns the table named name, or nil.
func (p *Partition) TableByName(name string) *Table { return p.byName[name] }

// Tables returns the tables in ID order, in a new slice.
func (p *Partition) Tables() []*Table { return append([]*Table(nil), p.tables...) }

// SetObserver installs o as the observer of every table's changes,
// replacing any previous one; nil removes it.
func (p *Partition) SetObserver(o Observer) { p.observer = o }

// Observer returns the installed observer, or nil: a check that a finished
// table stream left the partition alone.
func (p *Partition) Observer() Observer { return p.observer }

// Clear drops every row of every table, as a rejoin destination does
// before a new attempt; tables, their IDs and schemas stay. It is a reset,
// not a change: the observer is not called. Slots start again from 0 and
// the digest is 0.
func (p *Partition) Clear() {
	for _, t := range p.tables {
		t.clear()
	}
}
