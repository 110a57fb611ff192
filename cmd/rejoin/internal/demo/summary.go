package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"

	"github.com/rejoin-db/rejoin/cmd/rejoin/internal/clusterview"
)

func (r *run) printSummary() error {
	if r.cfg.JSON {
		return WriteJSON(r.out, r.sum)
	}
	return WriteText(r.out, r.sum)
}

// WriteJSON prints the summary as one JSON object on one line.
func WriteJSON(w io.Writer, s Summary) error {
	return json.NewEncoder(w).Encode(s)
}

// WriteText prints the summary for a reader.
func WriteText(w io.Writer, s Summary) error {
	verdict := "OK"
	if !s.DigestsMatch || s.AckedWritesLost > 0 {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "\n== rejoin demo summary: %s ==\n", verdict)
	via := "writes through gateway " + s.Gateway + ", which no fault targets"
	if s.Gateway == "" {
		via = "writes through every node, the killed ones included"
	}
	fmt.Fprintf(w, "cluster     %d nodes, %d partitions x %d replicas; %s\n", s.Nodes, s.Partitions, s.Replicas, via)
	if s.TLS {
		fmt.Fprintf(w, "security    mutual TLS 1.3 on every node connection, certificates from the demo's own CA (%s)\n", filepath.Join(s.Dir, "certs"))
		if s.EtcdTLS {
			fmt.Fprintf(w, "            etcd over TLS, a client certificate from that CA required of every client, nodes included;\n            etcd's authentication on: each node writes what a node may, the demo's client only reads\n")
		}
	} else {
		fmt.Fprintf(w, "security    INSECURE (--insecure): no TLS, anyone who reaches a node's port may do anything\n")
	}
	target := ""
	if s.FaultTarget != "" {
		target = " (hit " + s.FaultTarget + ")"
	}
	fmt.Fprintf(w, "fault       %s%s; killed and restarted %s\n", s.Fault, target, s.Victim)
	fmt.Fprintf(w, "load        %d rows at %.0f rows/s\n", s.LoadRows, s.LoadRowsPerSec)
	fmt.Fprintf(w, "rejoin      %d rows (%d snapshot), %.1f MB in %d partition rejoins; %.2f s from restart to all live\n",
		s.Rows, s.SnapshotRows, float64(s.Bytes)/1e6, s.RejoinedTasks, s.RejoinSeconds)
	fmt.Fprintf(w, "stream      %.2f s: %.0f rows/s, %.1f MB/s; handoff pause max %.2f ms; %d attempts (%d task starts), %d blocks resent; paced for the writes %d times\n",
		s.StreamSeconds, s.RowsPerSec, s.MBPerSec, s.HandoffPauseMs, s.Attempts, s.TaskAttempts, s.BlocksResent, s.PaceStarts)
	fmt.Fprintf(w, "writes      before %.0f/s (p99 %.2f ms); during rejoin %.0f/s (p99 %.2f ms); while down %.0f/s; %d failed, %d uncertain\n",
		s.WritesPerSecBefore, s.WriteP99MsBefore, s.WritesPerSecDuring, s.WriteP99MsDuring, s.WritesPerSecOutage, s.WriteErrors, s.WritesUncertain)
	fmt.Fprintf(w, "            longest without an acknowledged write from the kill on: %.2f s\n", s.WriteGapMaxSeconds)
	if err := writeChecks(w, s); err != nil {
		return err
	}
	for _, e := range s.LostExamples {
		fmt.Fprintf(w, "            lost: %s\n", e)
	}
	return nil
}

// writeChecks prints the run's checks, the demo's and the bench's alike:
// the digests compared and the acknowledged writes read back.
func writeChecks(w io.Writer, s Summary) error {
	match := "all match"
	if !s.DigestsMatch {
		match = fmt.Sprintf("MISMATCH in partitions %v", badPartitions(s.Digests))
	}
	fmt.Fprintf(w, "digests     %d replicas checked at a common txn ID per partition: %s\n", s.ReplicasChecked, match)
	if len(s.Digests) > 0 {
		if err := clusterview.RenderDigests(newIndent(w), clusterview.DigestReport{Partitions: s.Digests}); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "acked       %d acknowledged writes read back, %d lost\n", s.AckedWritesChecked, s.AckedWritesLost)
	return nil
}

// indent prefixes every line written through it with spaces.
type indent struct {
	w   io.Writer
	mid *bool // inside a line
}

func newIndent(w io.Writer) indent { return indent{w: w, mid: new(bool)} }

func (i indent) Write(p []byte) (int, error) {
	var out []byte
	for _, c := range p {
		if !*i.mid {
			out = append(out, "            "...)
			*i.mid = true
		}
		out = append(out, c)
		if c == '\n' {
			*i.mid = false
		}
	}
	if _, err := i.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
