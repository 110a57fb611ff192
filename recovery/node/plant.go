package node

import (
	"github.com/rejoin-db/rejoin/partition"
	"github.com/rejoin-db/rejoin/wire"
)

// plantSuffix is appended to the key of the write the planted fault loses.
const plantSuffix = "~planted"

// maybePlant is the planted fault of Config.PlantDropKey, off unless that
// is set: the first upsert of the key this initiator sequences writes
// another key instead, on every replica alike, and its call is
// acknowledged as if it had written its own: a lost acknowledged write
// that rejoin chaos's checker must report. Not part of the protocol.
func (n *Node) maybePlant(txn *wire.Txn) {
	key := n.cfg.PlantDropKey
	if key == "" || txn.Proc != partition.ProcUpsert || n.planted.Load() {
		return
	}
	vals, used, err := wire.DecodeValues(txn.Params, nil)
	if err != nil || used != len(txn.Params) || len(vals) < 3 || vals[1].Type != wire.TypeBytes || string(vals[1].Bytes) != key {
		return
	}
	if !n.planted.CompareAndSwap(false, true) {
		return
	}
	vals[1] = wire.Bytes(append([]byte(key), plantSuffix...))
	params, err := (&wire.TupleEncoder{}).AppendTuple(nil, vals)
	if err != nil {
		return
	}
	txn.Params = params
	n.log.Warn("planted fault: an acknowledged upsert lost", "key", key, "txn", txn.ID, "written_as", key+plantSuffix)
}
