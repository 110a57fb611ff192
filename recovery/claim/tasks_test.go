package claim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// scriptT0 is the script's clock origin: at=5s is scriptT0 + 5 s, and
// records print their UpdatedAt as an offset from it.
var scriptT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Claims in scripts live long (no expiry by surprise) and check often (a
// loss shows within a second).
const scriptTTL, scriptWindow = 60 * time.Second, time.Second

// TestTaskScripts runs the scenario scripts of testdata/tasks/*.txt, each
// against a fresh embedded etcd, so epochs (revisions) are the same every
// run. Commands:
//
//	create task=P/NODE at=DUR         CreateTask
//	claim exec=NAME task=P/NODE       Acquire, executor id NAME
//	start|touch|done exec=NAME at=DUR StartTask, Touch, MarkDone by NAME's attempt
//	requeue|fail exec=NAME at=DUR note=WORD
//	expire exec=NAME                  revoke NAME's lease, as its expiry would; wait for Lost
//	lost exec=NAME                    wait for NAME's Lost and say why
//	release exec=NAME                 Release
//	reset-stale at=DUR after=DUR [guard=KEY@REV]  ResetStale
//	show task=P/NODE | tasks | claims
func TestTaskScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/tasks", func(t *testing.T, path string) {
		checkLeaks(t)
		e := startEtcd(t)
		cli := newClient(t, e)
		s := &script{cli: cli, claims: map[string]*Claim{}}
		defer s.releaseAll()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := s.run(t, d)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			return out
		})
	})
}

type script struct {
	cli    *clientv3.Client
	claims map[string]*Claim
}

func (s *script) releaseAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range s.claims {
		_ = c.Release(ctx)
	}
}

func (s *script) run(t *testing.T, d *datadriven.TestData) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	at := func() time.Time {
		var v string
		d.ScanArgs(t, "at", &v)
		return scriptT0.Add(parseDuration(t, v))
	}
	task := func() Task {
		var v string
		d.ScanArgs(t, "task", &v)
		p, dest, _ := strings.Cut(v, "/")
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			t.Fatalf("%s: bad task %q", d.Pos, v)
		}
		return Task{Partition: uint32(n), Dest: dest}
	}
	exec := func() (string, *Claim) {
		var name string
		d.ScanArgs(t, "exec", &name)
		c := s.claims[name]
		if c == nil && d.Cmd != "claim" {
			t.Fatalf("%s: %s has no claim", d.Pos, name)
		}
		return name, c
	}
	note := func() string {
		var v string
		d.ScanArgs(t, "note", &v)
		return v
	}
	record := func(task Task, r Record, err error) (string, error) {
		if err != nil {
			return "", err
		}
		return formatRecord(task, r), nil
	}

	switch d.Cmd {
	case "create":
		tk := task()
		r, err := CreateTask(ctx, s.cli, tk, at())
		return record(tk, r, err)
	case "claim":
		name, old := exec()
		if old != nil {
			_ = old.Release(ctx) // a new attempt of the same executor name
		}
		tk := task()
		c, err := Acquire(ctx, s.cli, tk, name, scriptTTL, WithWindow(scriptWindow))
		if err != nil {
			return "", err
		}
		s.claims[name] = c
		return fmt.Sprintf("%s holds %s at epoch %d\n", name, tk, c.Epoch()), nil
	case "start":
		_, c := exec()
		r, err := StartTask(ctx, s.cli, c.Attempt(), at())
		return record(c.Task(), r, err)
	case "touch":
		_, c := exec()
		r, err := Touch(ctx, s.cli, c.Attempt(), at())
		return record(c.Task(), r, err)
	case "done":
		_, c := exec()
		r, err := MarkDone(ctx, s.cli, c.Attempt(), at())
		if errors.Is(err, ErrDuplicate) {
			return "ignored: " + err.Error() + "\n" + formatRecord(c.Task(), r), nil
		}
		return record(c.Task(), r, err)
	case "requeue":
		_, c := exec()
		r, err := Requeue(ctx, s.cli, c.Attempt(), note(), at())
		return record(c.Task(), r, err)
	case "fail":
		_, c := exec()
		r, err := MarkFailed(ctx, s.cli, c.Attempt(), note(), at())
		return record(c.Task(), r, err)
	case "expire":
		name, c := exec()
		if _, err := s.cli.Revoke(ctx, c.lease); err != nil {
			return "", err
		}
		return waitLost(name, c), nil
	case "lost":
		name, c := exec()
		return waitLost(name, c), nil
	case "release":
		name, c := exec()
		if err := c.Release(ctx); err != nil {
			return "", err
		}
		return name + " released\n", nil
	case "reset-stale":
		var after string
		d.ScanArgs(t, "after", &after)
		var guards []clientv3.Cmp
		if d.HasArg("guard") {
			// guard=KEY@REV: the write requires KEY's CreateRevision to be
			// REV (0: KEY absent), as a supervisor's election key.
			var g string
			d.ScanArgs(t, "guard", &g)
			key, rev, _ := strings.Cut(g, "@")
			n, err := strconv.ParseInt(rev, 10, 64)
			if err != nil {
				t.Fatalf("%s: bad guard %q", d.Pos, g)
			}
			guards = append(guards, clientv3.Compare(clientv3.CreateRevision(key), "=", n))
		}
		resets, err := ResetStale(ctx, s.cli, at(), parseDuration(t, after), guards...)
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, r := range resets {
			fmt.Fprintf(&b, "reset %s (was %s at epoch %d): %s\n", r.Task, r.Was.Status, r.Was.Epoch, r.Why)
		}
		if len(resets) == 0 {
			b.WriteString("nothing stale\n")
		}
		return b.String(), nil
	case "show":
		tk := task()
		r, err := GetTask(ctx, s.cli, tk)
		return record(tk, r, err)
	case "tasks":
		all, err := Tasks(ctx, s.cli)
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, tr := range all {
			b.WriteString(formatRecord(tr.Task, tr.Record))
		}
		return b.String(), nil
	case "claims":
		resp, err := s.cli.Get(ctx, claimsPrefix, clientv3.WithPrefix())
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, kv := range resp.Kvs {
			fmt.Fprintf(&b, "%s: %s at epoch %d\n", strings.TrimPrefix(string(kv.Key), keyRoot), kv.Value, kv.CreateRevision)
		}
		if len(resp.Kvs) == 0 {
			b.WriteString("no claims\n")
		}
		return b.String(), nil
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return "", nil
}

// waitLost waits for c's Lost, a window and a margin at most, and says
// which kind of loss it was.
func waitLost(name string, c *Claim) string {
	select {
	case <-c.Lost():
	case <-time.After(c.Window() + lossSlack):
		return name + " still holds its claim\n"
	}
	for _, cause := range []error{ErrClaimGone, ErrSuperseded, ErrUnreachable, ErrReleased} {
		if errors.Is(c.Err(), cause) {
			return fmt.Sprintf("%s lost its claim: %v\n", name, cause)
		}
	}
	if errors.Is(c.Err(), ErrKeepAliveEnded) {
		// A revoked lease ends the keepalive too; which of the two the
		// claim notices first is a race, and either is right.
		return fmt.Sprintf("%s lost its claim: %v\n", name, ErrClaimGone)
	}
	return fmt.Sprintf("%s lost its claim: %v\n", name, c.Err())
}

func formatRecord(task Task, r Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s attempts=%d", task, r.Status, r.Attempts)
	if r.Executor != "" {
		fmt.Fprintf(&b, " executor=%s epoch=%d", r.Executor, r.Epoch)
	}
	fmt.Fprintf(&b, " updated=+%s opened=%d", r.UpdatedAt.Sub(scriptT0), r.Opened)
	if r.Note != "" {
		fmt.Fprintf(&b, " note=%q", r.Note)
	}
	b.WriteString("\n")
	return b.String()
}

func parseDuration(t *testing.T, s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("bad duration %q: %v", s, err)
	}
	return d
}
