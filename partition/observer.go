package partition

// Observer is told about every change to a partition's rows. The cow
// package installs one to keep its change log while a table stream is
// active; the partition has at most one observer at a time
// (Partition.SetObserver).
//
// Calls are synchronous, on the goroutine that made the change, after the
// change is applied: during OnInsert and OnUpdate, Table.Tuple(s) already
// returns the new tuple; during OnDelete the slot is already free. An
// observer must not write to the partition from inside a call.
//
// An update that changes the primary key of a row is reported as
// OnDelete(old key) followed by OnInsert of the same slot, so a change log
// keyed by primary key sees the old key go and the new one come. An update
// that keeps the key is one OnUpdate, even if the new tuple equals the old.
// A failed write reports nothing, and Partition.Clear, a reset rather than
// a change, reports nothing either.
type Observer interface {
	// OnInsert reports that slot s of table t now holds a new row.
	OnInsert(t TableID, s Slot)
	// OnUpdate reports that the row in slot s of table t changed but kept
	// its primary key.
	OnUpdate(t TableID, s Slot)
	// OnDelete reports that the row with primary key key (a canonical key
	// tuple) left slot s of table t. key is valid only during the call;
	// copy it to keep it.
	OnDelete(t TableID, s Slot, key []byte)
}
