package claim

import (
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// FuzzDecodeRecord feeds decodeRecord a task record of any key and value.
// It must refuse it with a "corrupt task record" error and the zero
// Record, or decode it into a record that re-encodes (encodeRecord, as the
// writers store it) to a value that decodes to the same record again.
// encoding/json takes more than one spelling of a record, so what
// round-trips is the record, not the bytes. Seeds live in
// testdata/fuzz/FuzzDecodeRecord/.
//
// Every accepted record can be written back: it has a status (a value
// without one, `{}` or `null`, would reach Record.move's panic) and its
// time is in UTC (a zone offset of 24 hours decodes, but
// time.Time.MarshalJSON refuses it).
//
//	go test -run='^$' -fuzz='^FuzzDecodeRecord$' -fuzztime=250000x ./recovery/claim/
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(tasksPrefix+"0000000007/n2"), []byte(`{"status":"running","attempts":1,"executor":"h:1:ab","epoch":9,"updated_at":"2026-11-22T10:00:00Z"}`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		kv := func(v []byte) *mvccpb.KeyValue {
			return &mvccpb.KeyValue{Key: key, Value: v, CreateRevision: 5, ModRevision: 6}
		}
		r, err := decodeRecord(kv(value))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "claim: corrupt task record ") {
				t.Fatalf("error %v does not say corrupt", err)
			}
			if r != (Record{}) {
				t.Fatalf("error %v with record %+v", err, r)
			}
			return
		}
		if r.Opened != 5 || r.ModRevision != 6 {
			t.Fatalf("record %+v of revisions 5, 6", r)
		}
		if r.Status < StatusPending || r.Status > StatusFailed || r.UpdatedAt.Location() != time.UTC {
			t.Fatalf("accepted record %+v: status or zone no writer stores", r)
		}
		v, err := encodeRecord(r)
		if err != nil {
			t.Fatalf("re-encoding %+v: %v", r, err)
		}
		again, err := decodeRecord(kv([]byte(v)))
		if err != nil {
			t.Fatalf("%+v re-encodes as %s, which does not decode: %v", r, v, err)
		}
		if again != r {
			t.Fatalf("%+v re-encodes as %s, which decodes to %+v", r, v, again)
		}
	})
}
