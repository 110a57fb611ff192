package cow

import "errors"

// Error classes. Every error this package returns wraps exactly one of
// these, so callers classify with errors.Is and keep the text for logs.
var (
	// ErrConfig: a Config field is out of range; Activate refuses to start.
	ErrConfig = errors.New("cow: invalid config")
	// ErrPhase: a call that the stream's current phase does not allow, such
	// as StartRound during the snapshot or after Deactivate. The stream is
	// unchanged.
	ErrPhase = errors.New("cow: wrong phase")
	// ErrUnknownTable: a block names a table the destination does not have.
	// Nothing was applied.
	ErrUnknownTable = errors.New("cow: unknown table")
	// ErrBadBlock: a block is malformed (unknown kind, a tuple array header
	// that is broken or disagrees with Count, trailing bytes) or a tuple
	// does not match its table's schema or key. Nothing was applied. When
	// the cause is in the tuple format, the error wraps the wire error too.
	ErrBadBlock = errors.New("cow: bad block")
)
