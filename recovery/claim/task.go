package claim

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Key layout in etcd (see doc.go). Partitions are zero-padded so that a
// range read returns tasks in partition order.
const (
	keyRoot         = "/rejoin/"
	claimsPrefix    = keyRoot + "claims/"
	tasksPrefix     = keyRoot + "tasks/"
	partitionDigits = 10 // len("4294967295")
)

// Limits on names that become part of keys.
const (
	// NodeBytesMax bounds a destination node id.
	NodeBytesMax = 128
	// ExecutorBytesMax bounds an executor id (host:pid:nonce).
	ExecutorBytesMax = 320
)

// ErrBadName: a node or executor id that cannot be stored.
var ErrBadName = errors.New("claim: bad name")

// Task is one rejoin: partition Partition rebuilt onto node Dest. It names
// both the claim and the task record.
type Task struct {
	Partition uint32
	Dest      string
}

func (t Task) String() string { return fmt.Sprintf("%d->%s", t.Partition, t.Dest) }

// validate checks that Dest can be a key segment: non-empty, bounded, no
// '/', no control bytes.
func (t Task) validate() error {
	return checkName("destination node id", t.Dest, NodeBytesMax, "/")
}

func (t Task) suffix() string {
	return fmt.Sprintf("%0*d/%s", partitionDigits, t.Partition, t.Dest)
}

// ClaimKey is the etcd key of the task's claim.
func (t Task) ClaimKey() string { return claimsPrefix + t.suffix() }

// RecordKey is the etcd key of the task's record.
func (t Task) RecordKey() string { return tasksPrefix + t.suffix() }

// parseTask is the inverse of suffix: key is a ClaimKey or RecordKey
// without its prefix.
func parseTask(suffix string) (Task, error) {
	p, dest, ok := strings.Cut(suffix, "/")
	if !ok || len(p) != partitionDigits {
		return Task{}, fmt.Errorf("claim: malformed task key %q", suffix)
	}
	n, err := strconv.ParseUint(p, 10, 32)
	if err != nil {
		return Task{}, fmt.Errorf("claim: malformed task key %q: %w", suffix, err)
	}
	t := Task{Partition: uint32(n), Dest: dest}
	if err := t.validate(); err != nil {
		return Task{}, err
	}
	return t, nil
}

// NewExecutorID returns an executor id "host:pid:nonce". Host and pid tell
// an operator where the executor runs (DESIGN.md step 1); the random nonce makes the
// id unique for this executor even when a restarted process reuses a pid.
func NewExecutorID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:]) // crypto/rand.Read never fails (Go 1.24+)
	return host + ":" + strconv.Itoa(os.Getpid()) + ":" + hex.EncodeToString(nonce[:])
}

func checkName(what, s string, max int, forbidden string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrBadName, what)
	case len(s) > max:
		return fmt.Errorf("%w: %s of %d bytes, at most %d", ErrBadName, what, len(s), max)
	case strings.ContainsAny(s, forbidden):
		return fmt.Errorf("%w: %s %q contains one of %q", ErrBadName, what, s, forbidden)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: %s %q has a control character", ErrBadName, what, s)
		}
	}
	return nil
}
