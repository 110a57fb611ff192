package supervise

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Revisions and lease the fuzzed keys carry, for checking that the
// decoders copy them.
const (
	fuzzCreated  = 11
	fuzzModified = 12
	fuzzLease    = 13
)

// recordPrefixes are the prefixes of the records the decoders read, by
// the fuzzed kind. The key is the prefix and the fuzzed suffix: every
// record is read by a range over its prefix (rangeAll) or by a key built
// on it (GetAssignment), so a key without it never reaches a decoder.
var recordPrefixes = [...]string{nodesPrefix, replicasPrefix, assignPrefix, incarnationsPrefix, claimsPrefix, reportPrefix, fencePrefix}

// FuzzDecodeRecord feeds decodeNode, decodeReplica, decodeAssignment,
// decodeIncarnation, decodeReport or decodeFence (by kind) a record of any suffix and value. Each must
// refuse it with an error or decode it into a record that re-encodes
// (encode, as the writers store it) to a value that decodes to the same
// record again, under the same key. decodeHolder reads a claim key,
// whose value is claim's executor id, not JSON: what it takes from the
// key and the value must be there. encoding/json takes more than one spelling of a
// record, so what round-trips is the record, not the bytes.
//
// Anything refused is ErrCorrupt, and anything accepted can be written
// back (times in UTC: a zone offset of 24 hours decodes, but
// time.Time.MarshalJSON refuses it).
//
// The seeds are fuzzSeeds rather than files under testdata/fuzz, because
// TestDecideScripts runs every file under testdata as a decide script (a
// crasher the fuzzer saves there trips it as well).
//
//	go test -run='^$' -fuzz='^FuzzDecodeRecord$' -fuzztime=250000x ./recovery/supervise/
func FuzzDecodeRecord(f *testing.F) {
	for _, seed := range fuzzSeeds {
		f.Add(seed.kind, []byte(seed.suffix), []byte(seed.value))
	}
	f.Fuzz(func(t *testing.T, kind uint8, suffix, value []byte) {
		prefix := recordPrefixes[int(kind)%len(recordPrefixes)]
		kv := func(v []byte) *mvccpb.KeyValue {
			return &mvccpb.KeyValue{Key: append([]byte(prefix), suffix...), Value: v,
				CreateRevision: fuzzCreated, ModRevision: fuzzModified, Lease: fuzzLease}
		}
		switch prefix {
		case nodesPrefix:
			n, err := decodeNode(kv(value))
			if err != nil {
				checkCorrupt(t, err)
				return
			}
			if n.ID != string(suffix) || n.Created != fuzzCreated || n.ModRevision != fuzzModified || n.Lease != fuzzLease {
				t.Fatalf("node %+v from key %q", n, kv(value).Key)
			}
			checkReencodes(t, n, func(v []byte) (NodeRecord, error) { return decodeNode(kv(v)) }, n.Started, n.LastActive)
		case replicasPrefix:
			r, err := decodeReplica(kv(value))
			if err != nil {
				checkCorrupt(t, err)
				return
			}
			if ReplicaKey(r.Partition, r.Node) != string(kv(value).Key) {
				t.Fatalf("replica %+v from key %q", r, kv(value).Key)
			}
			checkReencodes(t, r, func(v []byte) (Replica, error) { return decodeReplica(kv(v)) })
		case assignPrefix:
			a, err := decodeAssignment(kv(value))
			if err != nil {
				checkCorrupt(t, err)
				return
			}
			if AssignmentKey(a.Task) != string(kv(value).Key) || a.ModRevision != fuzzModified {
				t.Fatalf("assignment %+v from key %q", a, kv(value).Key)
			}
			checkReencodes(t, a, func(v []byte) (Assignment, error) { return decodeAssignment(kv(v)) }, a.AssignedAt)
		case incarnationsPrefix:
			i, err := decodeIncarnation(kv(value))
			if err != nil {
				checkCorrupt(t, err)
				return
			}
			if IncarnationKey(i.Node) != string(kv(value).Key) || i.ModRevision != fuzzModified || i.Count == 0 {
				t.Fatalf("incarnation %+v from key %q", i, kv(value).Key)
			}
			checkReencodes(t, i, func(v []byte) (Incarnation, error) { return decodeIncarnation(kv(v)) }, i.Started)
		case reportPrefix:
			r, err := decodeReport(kv(value))
			if err != nil {
				checkCorrupt(t, err)
				return
			}
			if ReportKey(r.Suspect, r.Reporter) != string(kv(value).Key) {
				t.Fatalf("report %+v from key %q", r, kv(value).Key)
			}
			checkReencodes(t, r, func(v []byte) (Report, error) { return decodeReport(kv(v)) })
		case fencePrefix:
			f, err := decodeFence(kv(value))
			if err != nil {
				checkCorrupt(t, err)
				return
			}
			if FenceKey(f.Node) != string(kv(value).Key) || f.Rev != fuzzModified {
				t.Fatalf("fence %+v from key %q", f, kv(value).Key)
			}
			checkReencodes(t, f, func(v []byte) (Fence, error) { return decodeFence(kv(v)) })
		case claimsPrefix:
			h, err := decodeHolder(kv(value))
			if err != nil {
				checkCorrupt(t, err)
				return
			}
			if h.Task.ClaimKey() != string(kv(value).Key) || h.Epoch != fuzzCreated || h.Executor != string(value) {
				t.Fatalf("holder %+v from key %q", h, kv(value).Key)
			}
			if h.Node != "" && (!strings.HasPrefix(h.Executor, h.Node+"/") || checkID("node id", h.Node, nodeIDBytesMax) != nil) {
				t.Fatalf("holder %+v: node not the executor's", h)
			}
		}
	})
}

const (
	nodeJSON   = `{"address":"127.0.0.1:7001","http":"127.0.0.1:8001","started":"2026-11-22T10:00:00.123456789Z","last_active":"2026-11-22T10:00:01Z","status":"not-responding","outgoing_max":3}`
	assignJSON = `{"source":"n1","seq":2,"opened":5,"assigned_at":"2026-11-22T10:00:00Z","superseded":4,"declined":["n4","n5"],"reason":"node n2 restarted"}`
)

// fuzzSeeds are records as the writers store them, and broken ones; kind
// indexes recordPrefixes.
var fuzzSeeds = []struct {
	kind          uint8
	suffix, value string
}{
	{0, "n1", nodeJSON},
	{0, "n2", `{"address":"a","started":"0001-01-01T00:00:00Z","last_active":"0001-01-01T00:00:00Z","status":"ready"}`},
	{0, "n3", `{"address":"a","started":"2026-11-22T11:00:00+01:00","last_active":"2026-11-22T10:00:00-00:30","status":"ready"}`},
	{0, "n4", `{"address":"a","started":"yesterday"}`},
	{0, "n4", `{"started":"2026-11-22T10:00:00+24:00"}`},
	{0, "n5", nodeJSON[:40]},
	{0, "n6", `null`},
	{0, "", ``},
	{1, "0000000007/n2", `{"state":"live"}`},
	{1, "4294967295/n-9", `{"state":"needs-rejoin"}`},
	{1, "4294967296/n2", `{"state":"live"}`},
	{1, "7/n2", `{"state":"live"}`},
	{1, "+000000007/n2", `{"state":"live"}`},
	{1, "0000000007/", `{"state":"live"}`},
	{1, "0000000007/n2/x", `{"state":"live"}`},
	{1, "0000000007/n2", `{"state":3}`},
	{1, "0000000007/n2", `"live"`},
	{2, "0000000007/n3", assignJSON},
	{2, "0000000000/n3", `{"source":"n1","seq":1,"opened":1,"assigned_at":"2026-11-22T10:00:00Z","reason":""}`},
	{2, "0000000007/n3", strings.Replace(assignJSON, `"seq":2`, `"seq":-2`, 1)},
	{2, "0000000007/n3", strings.Replace(assignJSON, `"opened":5`, `"opened":5.5`, 1)},
	{2, "0000000007/n3", strings.Replace(assignJSON, `["n4","n5"]`, `null`, 1)},
	{2, "0000000007/n3", assignJSON + ` x`},
	{2, "n3", assignJSON},
	{3, "n1", `{"count":1,"started":"2026-11-22T10:00:00.5Z"}`},
	{3, "n2", `{"count":18446744073709551615,"started":"2026-11-22T11:00:00+01:00"}`},
	{3, "n3", `{"count":0,"started":"2026-11-22T10:00:00Z"}`},
	{3, "n3", `{"count":-1,"started":"2026-11-22T10:00:00Z"}`},
	{3, "n3", `{"count":2}`},
	{3, "n3/x", `{"count":2,"started":"2026-11-22T10:00:00Z"}`},
	{3, "", `{"count":2,"started":"2026-11-22T10:00:00Z"}`},
	{3, "n4", `null`},
	{4, "0000000007/n3", "n1/host:42:0011223344556677"},
	{4, "0000000007/n3", "host:42:0011223344556677"},
	{4, "0000000007/n3", "/host:42:0011223344556677"},
	{4, "0000000007/n3", "n\x01/host"},
	{4, "0000000007/n3", ""},
	{4, "7/n3", "n1/host:42:00"},
	{4, "0000000007/n3/x", "n1/host:42:00"},
	{5, "n2/n1", `{"inc":1795841035887789351}`},
	{5, "n2/n1/x", `{"inc":1}`},
	{5, "n2", `{"inc":1}`},
	{5, "/n1", `{"inc":1}`},
	{5, "n2/n1", `{"inc":"1"}`},
	{5, "n2/n1", `null`},
	{6, "n2", `{"inc":1795841035887789351,"by":"n1"}`},
	{6, "n2/x", `{"inc":1,"by":"n1"}`},
	{6, "", `{"inc":1,"by":"n1"}`},
	{6, "n2", `{"inc":1.5}`},
	{6, "n2", `[]`},
}

// checkCorrupt checks that a refusal is ErrCorrupt.
func checkCorrupt(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("error %v is not ErrCorrupt", err)
	}
}

// checkReencodes: rec was decoded, and times are its times; its stored
// form must decode again, to a record that stores the same way. The JSON
// holds every stored field (times with their offsets), so equal stored
// forms are equal records; the callers check the fields that come from
// the key.
func checkReencodes[R any](t *testing.T, rec R, decode func([]byte) (R, error), times ...time.Time) {
	t.Helper()
	for _, tm := range times {
		if tm.Location() != time.UTC {
			t.Fatalf("%+v: time %v not in UTC", rec, tm)
		}
	}
	v, err := encode(rec)
	if err != nil {
		t.Fatalf("re-encoding %+v: %v", rec, err)
	}
	again, err := decode([]byte(v))
	if err != nil {
		t.Fatalf("%+v re-encodes as %s, which does not decode: %v", rec, v, err)
	}
	if v2, err := encode(again); err != nil || v2 != v {
		t.Fatalf("%+v re-encodes as %s, which decodes to %+v, stored as %s (%v)", rec, v, again, v2, err)
	}
}
