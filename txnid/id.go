package txnid

import (
	"errors"
	"fmt"
)

// ID is a transaction ID; see the package doc for its layout. The zero value
// is Zero, which no Generator issues.
type ID uint64

// Initiator identifies the node role that issues IDs. Valid values are
// 0 <= in < InitiatorsMax.
type Initiator uint16

// Field widths. They add up to 64; TestLayoutFillsUint64 holds them to it.
const (
	MillisBits    = 42
	CounterBits   = 12
	InitiatorBits = 10
)

const (
	// InitiatorsMax is how many distinct initiators the ID space holds.
	InitiatorsMax = 1 << InitiatorBits // 1024

	// IDsPerMillisMax is how many IDs one initiator can issue within one
	// millisecond of logical time. Counter values run 0..IDsPerMillisMax-1.
	IDsPerMillisMax = 1 << CounterBits // 4096

	// MillisMax is the last representable millisecond since
	// EpochUnixMillis, 2165-05-15T07:35:11.103Z. It is an inclusive bound,
	// unlike the two counts above.
	MillisMax = 1<<MillisBits - 1

	// EpochUnixMillis is 2026-01-01T00:00:00Z in Unix milliseconds. Counting
	// from the project's start rather than 1970 buys back 56 years of
	// timestamp range.
	EpochUnixMillis int64 = 1_767_225_600_000
)

const (
	initiatorShift = 0
	counterShift   = InitiatorBits
	millisShift    = InitiatorBits + CounterBits

	initiatorMask = InitiatorsMax - 1
	counterMask   = IDsPerMillisMax - 1
)

const (
	// Zero sorts below every ID a Generator can issue; a Tracker uses it for
	// an initiator it has heard nothing from yet.
	Zero ID = 0
	// Max is the largest ID, every field full: a bound to compare against
	// (nothing can be above it), not an ID a Generator should reach.
	Max ID = ^ID(0)
)

// ErrInitiatorRange reports an initiator outside 0..InitiatorsMax-1.
var ErrInitiatorRange = errors.New("txnid: initiator out of range")

// Make packs the fields of an ID. ms counts milliseconds since
// EpochUnixMillis, not since 1970.
//
// Make panics if a field does not fit its bits: masking would silently alias
// two different IDs, and every caller either builds fields from this
// package's bounds (Generator) or is a test choosing values on purpose.
func Make(ms int64, counter uint32, initiator Initiator) ID {
	if ms < 0 || ms > MillisMax {
		panic(fmt.Sprintf("txnid: millis %d outside 0..%d", ms, int64(MillisMax)))
	}
	if counter >= IDsPerMillisMax {
		panic(fmt.Sprintf("txnid: counter %d outside 0..%d", counter, IDsPerMillisMax-1))
	}
	if initiator >= InitiatorsMax {
		panic(fmt.Sprintf("txnid: initiator %d outside 0..%d", initiator, InitiatorsMax-1))
	}
	return ID(ms)<<millisShift | ID(counter)<<counterShift | ID(initiator)<<initiatorShift
}

// Millis returns the ID's timestamp in milliseconds since EpochUnixMillis.
func (id ID) Millis() int64 { return int64(id >> millisShift) }

// UnixMillis returns the ID's timestamp in Unix milliseconds, for logs and
// for comparing with a clock reading.
func (id ID) UnixMillis() int64 { return id.Millis() + EpochUnixMillis }

// Counter returns the ID's sequence number within its millisecond.
func (id ID) Counter() uint32 { return uint32(id>>counterShift) & counterMask }

// Initiator returns the initiator that issued the ID.
func (id ID) Initiator() Initiator { return Initiator(id>>initiatorShift) & initiatorMask }

// String renders the fields rather than the raw integer, because the raw
// integer hides the one thing a reader wants: which initiator, and when.
func (id ID) String() string {
	return fmt.Sprintf("t%d.c%d.i%d", id.Millis(), id.Counter(), id.Initiator())
}
