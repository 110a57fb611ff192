package demo

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
)

func TestSummaryJSON(t *testing.T) {
	s := Summary{Fault: "cut-link", Rows: 12, Bytes: 3400, RejoinSeconds: 1.5, DigestsMatch: true, AckedWritesChecked: 9,
		Digests: []clusterview.PartitionDigests{{Partition: 0, Match: true}}}
	var b bytes.Buffer
	if err := WriteJSON(&b, s); err != nil {
		t.Fatal(err)
	}
	if strings.Count(b.String(), "\n") != 1 {
		t.Fatalf("not one line: %q", b.String())
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	// The figures, and the brief's.
	for _, k := range []string{"rows", "bytes", "rejoin_seconds", "rows_per_sec", "mb_per_sec", "writes_per_sec_before",
		"writes_per_sec_during", "write_p99_ms_before", "write_p99_ms_during", "handoff_pause_ms_max", "attempts",
		"replicas_checked", "digests_match", "acked_writes_checked", "acked_writes_lost", "fault", "load_rows_per_sec", "tls", "etcd_tls"} {
		if _, ok := m[k]; !ok {
			t.Errorf("summary JSON lacks %q", k)
		}
	}
	if m["fault"] != "cut-link" || m["rows"] != 12.0 || m["digests_match"] != true {
		t.Fatalf("values %v", m)
	}
}

func TestSummaryText(t *testing.T) {
	var b bytes.Buffer
	s := Summary{Fault: "none", Gateway: Gateway, Victim: "n3", DigestsMatch: false, AckedWritesLost: 2, LostExamples: []string{"key 01: missing"},
		Digests: []clusterview.PartitionDigests{{Partition: 1, Match: false, Problem: "n1 has 1, n2 has 2",
			Replicas: []clusterview.ReplicaDigest{{Node: "n1", Digest: 1, Rows: 3}, {Node: "n2", Digest: 2, Rows: 3}}}}}
	if err := WriteText(&b, s); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"summary: FAILED", "gateway n1, which no fault targets", "MISMATCH in partitions [1]",
		"            1          ", "lost: key 01: missing", "2 lost"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "no binary"},
		{Config{Binary: "x", Fault: "kill-source"}, "needs --replicas >= 3"},
		{Config{Binary: "x", Nodes: 1}, "--nodes 1"},
		{Config{Binary: "x", Replicas: 1}, "at least 2"},
		{Config{Binary: "x", Fault: "nope"}, "unknown fault"},
		{Config{Binary: "x"}, ""},
		{Config{Binary: "x", Fault: "pause-holder"}, ""},
	} {
		err := tc.cfg.Check()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Check(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	// The old name of pause-holder runs the same fault.
	old := Config{Binary: "x", Fault: "pause-executor"}
	if err := old.Check(); err != nil || old.Fault != FaultPauseHolder {
		t.Errorf("pause-executor: %v, fault %q", err, old.Fault)
	}
}

// TestNodeFlagsOutgoingMax: the sources serve as many rejoins at once as
// a destination takes (the nodes' own default, 2, capped a restarted node
// hosting 64 partitions at 4 rejoins from two sources), unless set.
func TestNodeFlagsOutgoingMax(t *testing.T) {
	for _, tc := range []struct {
		cfg      Config
		in, out  string
		checkErr string
	}{
		{cfg: Config{Binary: "x", Partitions: 96}, in: "96", out: "96"},
		{cfg: Config{Binary: "x", Partitions: 96, IncomingMax: 8}, in: "8", out: "8"},
		{cfg: Config{Binary: "x", Partitions: 96, IncomingMax: 8, OutgoingMax: 3}, in: "8", out: "3"},
		{cfg: Config{Binary: "x", OutgoingMax: -1}, checkErr: "--outgoing-max -1"},
	} {
		err := tc.cfg.Check()
		if tc.checkErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.checkErr) {
				t.Errorf("Check(%+v) = %v, want %q", tc.cfg, err, tc.checkErr)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		f := (&run{cfg: tc.cfg}).nodeFlags(1)
		flag := func(name string) string {
			i := slices.Index(f, name)
			if i < 0 || i+1 >= len(f) {
				return ""
			}
			return f[i+1]
		}
		if in, out := flag("--incoming-max"), flag("--outgoing-max"); in != tc.in || out != tc.out {
			t.Errorf("%+v: --incoming-max %q, --outgoing-max %q; want %q, %q", tc.cfg, in, out, tc.in, tc.out)
		}
	}
}
