package nodestate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rejoin-db/rejoin/recovery"
)

// FuzzDecodeRecord feeds one stored key and value to the decoders of the
// record's values, decodeReplica, decodeEpoch and decodeStart: whatever the bytes,
// either a clear ErrCorrupt or a record that encodes back to the very
// same key and value. Seeds live in testdata/fuzz/FuzzDecodeRecord/.
//
//	go test -run='^$' -fuzz='^FuzzDecodeRecord$' -fuzztime=250000x ./recovery/nodestate/
func FuzzDecodeRecord(f *testing.F) {
	f.Add(replicaKey(7), encodeReplica(Replica{Partition: 7, State: recovery.ReplicaRejoining, Epoch: 42}))
	f.Add(keyStart, encodeStart(t0))
	f.Add(epochKey(7), encodeEpoch(1<<40))
	f.Fuzz(func(t *testing.T, key, v []byte) {
		if r, err := decodeReplica(key, v); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("replica error %v is not ErrCorrupt", err)
			}
			if r != (Replica{}) {
				t.Fatalf("error %v with replica %+v", err, r)
			}
		} else if !bytes.Equal(replicaKey(r.Partition), key) || !bytes.Equal(encodeReplica(r), v) {
			t.Fatalf("replica %+v from %x=%x re-encodes as %x=%x", r, key, v, replicaKey(r.Partition), encodeReplica(r))
		}

		if e, err := decodeEpoch(key, v); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("epoch error %v is not ErrCorrupt", err)
			}
			if e != 0 {
				t.Fatalf("error %v with epoch %d", err, e)
			}
		} else if e == 0 || !bytes.Equal(encodeEpoch(e), v) || !bytes.HasPrefix(key, epochLower) || !bytes.Equal(epochKey(binary.BigEndian.Uint32(key[len(epochLower):])), key) {
			t.Fatalf("epoch %d from %x=%x does not re-encode", e, key, v)
		}

		if ts, err := decodeStart(v); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("start time error %v is not ErrCorrupt", err)
			}
		} else if again := encodeStart(ts); !bytes.Equal(again, v) {
			t.Fatalf("start time %v from %x re-encodes as %x", ts, v, again)
		}
	})
}
