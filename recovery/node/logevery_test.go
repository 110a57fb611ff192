package node

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLimitedLog(t *testing.T) {
	var buf bytes.Buffer
	l := newLimitedLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), time.Second)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for range 100 {
		l.Log(slog.LevelWarn, "dial n2", "feed dial failed", "node", "n2")
		now = now.Add(10 * time.Millisecond)
	}
	l.Log(slog.LevelWarn, "dial n3", "feed dial failed", "node", "n3")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	// 100 occurrences of one key within an interval log once; another
	// key logs on its own.
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2 (n2 once, n3 once):\n%s", len(lines), buf.String())
	}
	if strings.Contains(lines[0], "repeats") || !strings.Contains(lines[1], "node=n3") {
		t.Fatalf("lines:\n%s", buf.String())
	}
	now = now.Add(time.Second)
	l.Log(slog.LevelWarn, "dial n2", "feed dial failed", "node", "n2")
	out := buf.String()
	if !strings.Contains(out, "repeats=99") || !strings.Contains(out, "since=2s") {
		t.Fatalf("the line after the interval does not count what it swallowed:\n%s", out)
	}
}
