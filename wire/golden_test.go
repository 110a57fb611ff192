package wire

import (
	"bytes"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden/*.hex from the current encoder")

// Golden files pin the byte format: a change that alters them changes
// what every peer and every stored tuple must agree on. Rewrite them with
// -update only on purpose, and review the diff.
func TestGolden(t *testing.T) {
	type golden struct {
		name string
		note string
		b    []byte
	}
	var files []golden
	seen := make(map[MsgType]bool)
	for _, m := range allSampleMessages(t) {
		if seen[m.Type()] {
			continue // one golden file per type
		}
		seen[m.Type()] = true
		files = append(files, golden{
			name: "msg_" + strings.ToLower(m.Type().String()),
			note: m.Type().String() + " message payload, as AppendMessage writes it",
			b:    AppendMessage(nil, m),
		})
	}
	// A control message frame, and a block frame with each codec whose
	// output is stable. zstd output may change with the library version,
	// so zstd frames are only tested for round trips.
	files = append(files,
		golden{"frame_none_propose", "Propose frame, codec none", mustFrame(t, sampleMessages(t)[0], CodecNone)},
		golden{"frame_none_reply", "Reply frame with Each, codec none", mustFrame(t, sampleClusterMessages(t)[5], CodecNone)},
		golden{"frame_none_block", "Block frame, codec none", mustFrame(t, compressibleBlock(t), CodecNone)},
		golden{"frame_s2_block", "Block frame, codec s2", mustFrame(t, compressibleBlock(t), CodecS2)},
		golden{"tuple", "one tuple of int64, float64, string, bytes", mustTuple(t,
			[]Value{Int64(-129), Float64(0.5), String("héllo"), Bytes([]byte{0, 1, 2})})},
	)
	for _, g := range files {
		path := filepath.Join("testdata", "golden", g.name+".hex")
		if *update {
			if err := os.WriteFile(path, formatHex(g.note, g.b), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -update to create)", err)
		}
		want, err := parseHex(text)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !bytes.Equal(g.b, want) {
			t.Errorf("%s: encoding changed:\ngot  %x\nwant %x", path, g.b, want)
		}
	}
	// The golden frames decode to the messages they were made from, with
	// whatever library version reads them.
	for name, want := range map[string]Message{
		"frame_none_block": compressibleBlock(t),
		"frame_s2_block":   compressibleBlock(t),
	} {
		text, err := os.ReadFile(filepath.Join("testdata", "golden", name+".hex"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := parseHex(text)
		if err != nil {
			t.Fatal(err)
		}
		if got, _, err := DecodeFrame(b); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s decodes to %v, %v", name, got, err)
		}
	}
}

func mustTuple(t testing.TB, vals []Value) []byte {
	var e TupleEncoder
	b, err := e.AppendTuple(nil, vals)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// formatHex writes a note line and the bytes as hex, 32 to a line.
func formatHex(note string, b []byte) []byte {
	var out bytes.Buffer
	out.WriteString("# " + note + "\n")
	for len(b) > 0 {
		n := min(len(b), 32)
		out.WriteString(hex.EncodeToString(b[:n]) + "\n")
		b = b[n:]
	}
	return out.Bytes()
}

// parseHex reads what formatHex writes: # lines are notes, whitespace is
// ignored.
func parseHex(text []byte) ([]byte, error) {
	var digits strings.Builder
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		digits.WriteString(strings.Join(strings.Fields(line), ""))
	}
	return hex.DecodeString(digits.String())
}
