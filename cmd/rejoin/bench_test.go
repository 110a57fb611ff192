package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestBenchCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"bench", "--rows", "3000", "--block-bytes", "4096", "--json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	var got map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	if got["rows"] != float64(3000) {
		t.Fatalf("rows %v, want 3000", got["rows"])
	}
	for _, k := range []string{"rejoin_seconds", "rows_per_sec", "mb_per_sec", "bytes"} {
		if v, ok := got[k].(float64); !ok || v <= 0 {
			t.Errorf("%s = %v, want a positive number", k, got[k])
		}
	}

	out.Reset()
	errOut.Reset()
	if code := run([]string{"bench", "--rows", "2000", "--codec", "s2"}, &out, &errOut); code != 0 {
		t.Fatalf("text run: exit %d, stderr %q", code, errOut.String())
	}
	if !strings.Contains(out.String(), "rejoined 2000 rows") || !strings.Contains(out.String(), "digests match") {
		t.Fatalf("text output %q", out.String())
	}

	for _, args := range [][]string{{"bench", "--codec", "lz4"}, {"bench", "--rows", "-1"}, {"bench", "extra"}} {
		errOut.Reset()
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, errOut.String())
		}
	}
}
