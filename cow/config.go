package cow

import (
	"fmt"

	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// Limits on Config fields, so a typo cannot ask for a block no frame can
// carry or a throttle window that takes gigabytes to track.
const (
	// BlockBytesLimit bounds Config.BlockBytesMax: a block's tuples plus
	// the Block message's head must fit one frame (wire.FramePayloadRawBytesMax).
	BlockBytesLimit = wire.FramePayloadRawBytesMax - 64
	// ChangeLogBytesLimit bounds Config.ChangeLogBytesMax. Deleted keys are
	// located by 4-byte offsets (see changeLog), so a log must stay well
	// under 4 GiB.
	ChangeLogBytesLimit = 1 << 30
	// ThrottleWindowTicksLimit bounds Config.ThrottleWindowTicks; the
	// throttle keeps two counters per tick of the window.
	ThrottleWindowTicksLimit = 1 << 16
)

// A row the partition accepts must fit one block, or a rejoin could never
// ship it: this constant overflows, and the build fails, if it does not.
const _ = uint(BlockBytesLimit - partition.TupleBytesMax)

// Config sets a stream's limits. Sizes are in bytes, times in ticks.
type Config struct {
	// BlockBytesMax bounds the tuple bytes (array header excluded) of one
	// block. A block always holds at least one tuple, so a single tuple
	// larger than this travels alone in a block of its own.
	BlockBytesMax int
	// ChangeLogBytesMax bounds the change log, counted as changeLog.bytes
	// says: 4 bytes per dirty slot plus, per deleted key, its bytes and a
	// 4-byte offset; the current log and the unshipped rest of the round in
	// flight together.
	ChangeLogBytesMax int
	// ChangeLogTxnBytesMax is the reserve for one transaction: the most log
	// bytes one txn is expected to add. The gate holds every txn while the
	// log is above ChangeLogBytesMax - ChangeLogTxnBytesMax, so the log
	// never exceeds ChangeLogBytesMax as long as no txn adds more than
	// ChangeLogTxnBytesMax. A txn that adds more is still let through (the
	// rejoin must not fail because the source is busy) and is counted in
	// Metrics.TxnsOverReserve; the log may then pass its bound by that
	// txn's excess.
	ChangeLogTxnBytesMax int
	// PaceLowWaterBytes: pacing starts only while the log is above it, and
	// stops as soon as the log drains to it or below. At most
	// ChangeLogBytesMax - ChangeLogTxnBytesMax.
	PaceLowWaterBytes int
	// ThrottleWindowTicks is the window over which the throttle compares
	// what the log grew by with what shipping drained from it.
	ThrottleWindowTicks int
	// PaceTxnsPerTick is how many txns may run per tick while pacing.
	PaceTxnsPerTick int
}

// DefaultConfig returns the limits a node uses unless told otherwise:
// 256 KiB blocks, a 64 MiB log with a 1 MiB per-txn reserve, pacing above
// 16 MiB at 100 txns per tick judged over 10 ticks.
func DefaultConfig() Config {
	return Config{
		BlockBytesMax:        256 << 10,
		ChangeLogBytesMax:    64 << 20,
		ChangeLogTxnBytesMax: 1 << 20,
		PaceLowWaterBytes:    16 << 20,
		ThrottleWindowTicks:  10,
		PaceTxnsPerTick:      100,
	}
}

// Validate checks every field against its range; the error wraps ErrConfig
// and names the first field out of range.
func (c Config) Validate() error {
	switch {
	case c.BlockBytesMax < 1 || c.BlockBytesMax > BlockBytesLimit:
		return fmt.Errorf("%w: BlockBytesMax %d, want 1..%d", ErrConfig, c.BlockBytesMax, BlockBytesLimit)
	case c.ChangeLogBytesMax < 2 || c.ChangeLogBytesMax > ChangeLogBytesLimit:
		return fmt.Errorf("%w: ChangeLogBytesMax %d, want 2..%d", ErrConfig, c.ChangeLogBytesMax, ChangeLogBytesLimit)
	case c.ChangeLogTxnBytesMax < 1 || c.ChangeLogTxnBytesMax >= c.ChangeLogBytesMax:
		// The reserve must leave room: with a reserve as large as the log,
		// the gate would hold even an empty log's first txn forever.
		return fmt.Errorf("%w: ChangeLogTxnBytesMax %d, want 1..%d (below ChangeLogBytesMax)", ErrConfig, c.ChangeLogTxnBytesMax, c.ChangeLogBytesMax-1)
	case c.PaceLowWaterBytes < 0 || c.PaceLowWaterBytes > c.ChangeLogBytesMax-c.ChangeLogTxnBytesMax:
		return fmt.Errorf("%w: PaceLowWaterBytes %d, want 0..%d (ChangeLogBytesMax - ChangeLogTxnBytesMax)", ErrConfig, c.PaceLowWaterBytes, c.ChangeLogBytesMax-c.ChangeLogTxnBytesMax)
	case c.ThrottleWindowTicks < 1 || c.ThrottleWindowTicks > ThrottleWindowTicksLimit:
		return fmt.Errorf("%w: ThrottleWindowTicks %d, want 1..%d", ErrConfig, c.ThrottleWindowTicks, ThrottleWindowTicksLimit)
	case c.PaceTxnsPerTick < 1:
		// Zero would be a hold that only draining below the low-water mark
		// lifts; the hard hold already does that job.
		return fmt.Errorf("%w: PaceTxnsPerTick %d, want >= 1", ErrConfig, c.PaceTxnsPerTick)
	}
	return nil
}
