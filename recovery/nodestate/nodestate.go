package nodestate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rejoin-db/rejoin/recovery"
)

// Errors of the record, classified with errors.Is.
var (
	// ErrOtherNode: the data directory holds another node's record.
	ErrOtherNode = errors.New("nodestate: data directory belongs to another node")
	// ErrCorrupt: a stored value does not decode.
	ErrCorrupt = errors.New("nodestate: corrupt record")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("nodestate: closed")
	// ErrStaleEpoch: a fencing epoch below the highest the record holds
	// for the partition.
	ErrStaleEpoch = errors.New("nodestate: stale epoch")
)

// Replica is the durable record of one partition replica on this node.
type Replica struct {
	Partition uint32
	State     recovery.ReplicaState
	// Epoch is the fencing epoch of the rejoin attempt while rejoining.
	Epoch uint64
}

// StartReport is what Open found.
type StartReport struct {
	// First is true when the directory held no record: a new node.
	First bool
	// Unexpected is true when the last run ended without Close.
	Unexpected bool
	// LastStart is when the previous run started (zero if First).
	LastStart time.Time
	// Interrupted lists the replicas that were in an interim state
	// (rejoining) and were put back to needs-rejoin.
	Interrupted []Replica
	// Reset counts every replica put back to needs-rejoin, the live ones
	// included: their content died with the process.
	Reset int
}

// Keys of the record. Replica keys sort by partition.
var (
	keyIdentity  = []byte("node/identity")
	keyStart     = []byte("node/start")
	keyClean     = []byte("node/clean")
	replicaLower = []byte("replica/")
	replicaUpper = []byte("replica0") // '0' follows '/'
	epochLower   = []byte("epoch/")
	epochUpper   = []byte("epoch0") // '0' follows '/'
)

func replicaKey(partition uint32) []byte {
	return binary.BigEndian.AppendUint32(append([]byte(nil), replicaLower...), partition)
}

func epochKey(partition uint32) []byte {
	return binary.BigEndian.AppendUint32(append([]byte(nil), epochLower...), partition)
}

// Store is an open node record. Its methods are safe for concurrent use
// (pebble's are).
type Store struct {
	db     *pebble.DB
	nodeID string
	log    *slog.Logger
	// epochMu makes RaiseEpoch's read and write one step.
	epochMu sync.Mutex
}

// Open opens (or creates) the record of node nodeID in dir, checks it is
// this node's, reports how the last run ended, puts every replica back to
// needs-rejoin, records the start time now, and removes the clean marker,
// all before it returns. log receives the unexpected-shutdown report and
// pebble's errors; nil means slog.Default().
func Open(dir, nodeID string, now time.Time, log *slog.Logger) (*Store, StartReport, error) {
	if nodeID == "" {
		return nil, StartReport{}, errors.New("nodestate: empty node id")
	}
	if log == nil {
		log = slog.Default()
	}
	db, err := pebble.Open(dir, &pebble.Options{Logger: pebbleLogger{log}})
	if err != nil {
		return nil, StartReport{}, fmt.Errorf("nodestate: open %s: %w", dir, err)
	}
	s := &Store{db: db, nodeID: nodeID, log: log}
	rep, err := s.start(now)
	if err != nil {
		_ = db.Close()
		return nil, StartReport{}, err
	}
	return s, rep, nil
}

func (s *Store) start(now time.Time) (StartReport, error) {
	var rep StartReport
	id, found, err := s.get(keyIdentity)
	if err != nil {
		return rep, err
	}
	switch {
	case !found:
		rep.First = true
	case string(id) != s.nodeID:
		return rep, fmt.Errorf("%w: it is node %q's, this is node %q", ErrOtherNode, id, s.nodeID)
	default:
		_, clean, err := s.get(keyClean)
		if err != nil {
			return rep, err
		}
		rep.Unexpected = !clean
		if v, ok, err := s.get(keyStart); err != nil {
			return rep, err
		} else if ok {
			if rep.LastStart, err = decodeStart(v); err != nil {
				return rep, err
			}
		}
	}
	replicas, err := s.Replicas()
	if err != nil {
		return rep, err
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, r := range replicas {
		if r.State == recovery.ReplicaRejoining {
			rep.Interrupted = append(rep.Interrupted, r)
		}
		if r.State != recovery.ReplicaNeedsRejoin {
			rep.Reset++
			if err := b.Set(replicaKey(r.Partition), encodeReplica(Replica{Partition: r.Partition, State: recovery.ReplicaNeedsRejoin}), nil); err != nil {
				return rep, err
			}
		}
	}
	if err := b.Set(keyIdentity, []byte(s.nodeID), nil); err != nil {
		return rep, err
	}
	if err := b.Set(keyStart, encodeStart(now), nil); err != nil {
		return rep, err
	}
	if err := b.Delete(keyClean, nil); err != nil {
		return rep, err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return rep, fmt.Errorf("nodestate: record start: %w", err)
	}
	if rep.Unexpected {
		s.log.Warn("unexpected shutdown: the last run ended without a clean stop",
			"node", s.nodeID, "last_start", rep.LastStart, "interrupted_rejoins", len(rep.Interrupted), "replicas_reset", rep.Reset)
	}
	for _, r := range rep.Interrupted {
		s.log.Info("interrupted rejoin put back to needs-rejoin", "node", s.nodeID, "partition", r.Partition, "epoch", r.Epoch)
	}
	return rep, nil
}

func (s *Store) get(key []byte) ([]byte, bool, error) {
	if s.db == nil {
		return nil, false, ErrClosed
	}
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("nodestate: get %s: %w", key, err)
	}
	out := append([]byte(nil), v...)
	return out, true, closer.Close()
}

// NodeID returns the node the record belongs to.
func (s *Store) NodeID() string { return s.nodeID }

// SetReplica records r, synced.
func (s *Store) SetReplica(r Replica) error {
	if s.db == nil {
		return ErrClosed
	}
	if !r.State.Valid() {
		return fmt.Errorf("nodestate: replica %d: invalid state %v", r.Partition, r.State)
	}
	if err := s.db.Set(replicaKey(r.Partition), encodeReplica(r), pebble.Sync); err != nil {
		return fmt.Errorf("nodestate: set replica %d: %w", r.Partition, err)
	}
	return nil
}

// SetReplicas records every replica of rs in one batch, synced once: all
// or none. Every record is checked before any is written.
func (s *Store) SetReplicas(rs []Replica) error {
	if s.db == nil {
		return ErrClosed
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, r := range rs {
		if !r.State.Valid() {
			return fmt.Errorf("nodestate: replica %d: invalid state %v", r.Partition, r.State)
		}
		if err := b.Set(replicaKey(r.Partition), encodeReplica(r), nil); err != nil {
			return fmt.Errorf("nodestate: set replica %d: %w", r.Partition, err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("nodestate: set %d replicas: %w", len(rs), err)
	}
	return nil
}

// Replicas returns every replica's record, by partition.
func (s *Store) Replicas() ([]Replica, error) {
	if s.db == nil {
		return nil, ErrClosed
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: replicaLower, UpperBound: replicaUpper})
	if err != nil {
		return nil, fmt.Errorf("nodestate: list replicas: %w", err)
	}
	var out []Replica
	for it.First(); it.Valid(); it.Next() {
		r, err := decodeReplica(it.Key(), it.Value())
		if err != nil {
			_ = it.Close()
			return nil, err
		}
		out = append(out, r)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("nodestate: list replicas: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Partition < out[j].Partition })
	return out, nil
}

// HighestEpoch returns the highest fencing epoch recorded for partition
// p's rejoin attempts on this node, 0 if none. Open leaves it as it was:
// unlike a replica's state, it outlives every run of the node.
func (s *Store) HighestEpoch(p uint32) (uint64, error) {
	v, found, err := s.get(epochKey(p))
	if err != nil || !found {
		return 0, err
	}
	return decodeEpoch(epochKey(p), v)
}

// RaiseEpoch records epoch as the highest seen for partition p, synced,
// before it returns. An epoch equal to the recorded one changes nothing;
// a lower one is refused with ErrStaleEpoch and changes nothing either.
func (s *Store) RaiseEpoch(p uint32, epoch uint64) error {
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	high, err := s.HighestEpoch(p)
	if err != nil {
		return err
	}
	switch {
	case epoch < high:
		return fmt.Errorf("%w: partition %d: epoch %d is below %d", ErrStaleEpoch, p, epoch, high)
	case epoch == high:
		return nil
	}
	if err := s.db.Set(epochKey(p), encodeEpoch(epoch), pebble.Sync); err != nil {
		return fmt.Errorf("nodestate: raise epoch of %d: %w", p, err)
	}
	return nil
}

// ResetEpochs forgets every partition's highest epoch, synced. The node
// calls it on its first start in a cluster (supervise.Incarnate): epochs
// are that cluster's etcd revisions, so any the directory holds come from
// another cluster, and would refuse every attempt of this one until its
// revisions caught up.
func (s *Store) ResetEpochs() error {
	s.epochMu.Lock()
	defer s.epochMu.Unlock()
	if s.db == nil {
		return ErrClosed
	}
	if err := s.db.DeleteRange(epochLower, epochUpper, pebble.Sync); err != nil {
		return fmt.Errorf("nodestate: reset epochs: %w", err)
	}
	return nil
}

// Close writes the clean-shutdown marker, synced, and closes the record.
// Closing twice is an error-free no-op.
func (s *Store) Close() error {
	if s.db == nil {
		return nil
	}
	err := s.db.Set(keyClean, []byte{1}, pebble.Sync)
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	s.db = nil
	if err != nil {
		return fmt.Errorf("nodestate: close: %w", err)
	}
	return nil
}

// A replica's value: state (1 byte), epoch (8 bytes, big-endian).
func encodeReplica(r Replica) []byte {
	return binary.BigEndian.AppendUint64([]byte{byte(r.State)}, r.Epoch)
}

// decodeReplica checks the key's prefix too, although Replicas only reads
// within it, so that no other key ever decodes as a replica.
func decodeReplica(key, v []byte) (Replica, error) {
	if len(key) != len(replicaLower)+4 || !bytes.HasPrefix(key, replicaLower) || len(v) != 9 {
		return Replica{}, fmt.Errorf("%w: replica key %x value %x", ErrCorrupt, key, v)
	}
	r := Replica{
		Partition: binary.BigEndian.Uint32(key[len(replicaLower):]),
		State:     recovery.ReplicaState(v[0]),
		Epoch:     binary.BigEndian.Uint64(v[1:]),
	}
	if !r.State.Valid() {
		return Replica{}, fmt.Errorf("%w: replica %d in state %d", ErrCorrupt, r.Partition, v[0])
	}
	return r, nil
}

// An epoch's value: the epoch (8 bytes, big-endian), never 0 (RaiseEpoch
// writes only above the 0 of no record).
func encodeEpoch(e uint64) []byte { return binary.BigEndian.AppendUint64(nil, e) }

func decodeEpoch(key, v []byte) (uint64, error) {
	if len(key) != len(epochLower)+4 || !bytes.HasPrefix(key, epochLower) || len(v) != 8 {
		return 0, fmt.Errorf("%w: epoch key %x value %x", ErrCorrupt, key, v)
	}
	e := binary.BigEndian.Uint64(v)
	if e == 0 {
		return 0, fmt.Errorf("%w: partition %d: epoch 0", ErrCorrupt, binary.BigEndian.Uint32(key[len(epochLower):]))
	}
	return e, nil
}

// The start time's value: Unix milliseconds (8 bytes, big-endian).
func encodeStart(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(t.UnixMilli()))
}

func decodeStart(v []byte) (time.Time, error) {
	if len(v) != 8 {
		return time.Time{}, fmt.Errorf("%w: start time of %d bytes", ErrCorrupt, len(v))
	}
	return time.UnixMilli(int64(binary.BigEndian.Uint64(v))).UTC(), nil
}

// pebbleLogger sends pebble's errors to slog and drops its chatter.
type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(string, ...any) {}

func (l pebbleLogger) Errorf(format string, args ...any) {
	l.log.Error("pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf is pebble's report of a state it cannot continue from; pebble
// expects it not to return.
func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := "pebble: " + fmt.Sprintf(format, args...)
	l.log.Error(msg)
	panic(msg)
}
