package nodestate

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rejoin-db/rejoin/recovery"
)

// childDirEnv makes the test binary act as a node process that writes its
// record and waits to be killed (TestSIGKILLIsUnexpectedShutdown).
const childDirEnv = "REJOIN_NODESTATE_CHILD_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childDirEnv); dir != "" {
		os.Exit(runChild(dir))
	}
	goleak.VerifyTestMain(m)
}

func runChild(dir string) int {
	s, _, err := Open(dir, "n1", time.Now(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		fmt.Println("open:", err)
		return 1
	}
	for _, r := range []Replica{{Partition: 1, State: recovery.ReplicaLive}, {Partition: 2, State: recovery.ReplicaRejoining, Epoch: 42}, {Partition: 3, State: recovery.ReplicaNeedsRejoin}} {
		if err := s.SetReplica(r); err != nil {
			fmt.Println("set:", err)
			return 1
		}
	}
	if err := s.RaiseEpoch(2, 42); err != nil {
		fmt.Println("raise:", err)
		return 1
	}
	fmt.Println("ready")
	// The parent kills this process; the sleep only bounds it if the
	// parent died first.
	time.Sleep(30 * time.Second)
	return 3
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func TestSIGKILLIsUnexpectedShutdown(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDirEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- strings.TrimSpace(line)
	}()
	select {
	case line := <-ready:
		if line != "ready" {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("child said %q", line)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("child not ready within 20 s")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL", err)
	}

	s, rep, err := Open(dir, "n1", t0, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if rep.First || !rep.Unexpected || rep.LastStart.IsZero() {
		t.Fatalf("report %+v: want an unexpected shutdown of a known node", rep)
	}
	if want := []Replica{{Partition: 2, State: recovery.ReplicaRejoining, Epoch: 42}}; !reflect.DeepEqual(rep.Interrupted, want) {
		t.Fatalf("interrupted %v, want %v", rep.Interrupted, want)
	}
	if rep.Reset != 2 {
		t.Fatalf("reset %d replicas, want 2 (the live one and the rejoining one)", rep.Reset)
	}
	got, err := s.Replicas()
	if err != nil {
		t.Fatal(err)
	}
	want := []Replica{{Partition: 1, State: recovery.ReplicaNeedsRejoin}, {Partition: 2, State: recovery.ReplicaNeedsRejoin}, {Partition: 3, State: recovery.ReplicaNeedsRejoin}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("replicas after restart %v, want every one needs-rejoin", got)
	}
	// The rejoin's epoch outlives the kill, and fences its stale messages.
	if e, err := s.HighestEpoch(2); err != nil || e != 42 {
		t.Fatalf("highest epoch after the kill %d, %v, want 42", e, err)
	}
	if err := s.RaiseEpoch(2, 41); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("epoch 41 after 42: %v, want ErrStaleEpoch", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A clean stop is not reported as unexpected.
	s, rep, err = Open(dir, "n1", t0.Add(time.Minute), quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rep.Unexpected || rep.First || !rep.LastStart.Equal(t0) || rep.Reset != 0 || len(rep.Interrupted) != 0 {
		t.Fatalf("report after a clean stop %+v", rep)
	}
}

func TestRecordLifecycle(t *testing.T) {
	dir := t.TempDir()
	s, rep, err := Open(dir, "n7", t0, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.First || rep.Unexpected {
		t.Fatalf("new record: %+v", rep)
	}
	if err := s.SetReplica(Replica{Partition: 9, State: 0}); err == nil {
		t.Fatal("invalid state accepted")
	}
	if err := s.SetReplica(Replica{Partition: 300, State: recovery.ReplicaLive}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetReplica(Replica{Partition: 2, State: recovery.ReplicaRejoining, Epoch: 5}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Replicas()
	if want := []Replica{{Partition: 2, State: recovery.ReplicaRejoining, Epoch: 5}, {Partition: 300, State: recovery.ReplicaLive}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("replicas %v, want %v", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := s.SetReplica(Replica{Partition: 1, State: recovery.ReplicaLive}); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v, want ErrClosed", err)
	}
	// Another node may not take this directory over.
	if _, _, err := Open(dir, "n8", t0, quiet()); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("other node: %v, want ErrOtherNode", err)
	}
	// Even after a clean stop, an in-memory replica holds nothing at start.
	s, rep, err = Open(dir, "n7", t0, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rep.Unexpected || rep.Reset != 2 || len(rep.Interrupted) != 1 {
		t.Fatalf("report %+v", rep)
	}
}

// TestSetReplicas: a batch of records is written whole, read back as
// SetReplica's, survives a reopen (reset as every record is), and a batch
// with one bad record writes none.
func TestSetReplicas(t *testing.T) {
	dir := t.TempDir()
	s, _, err := Open(dir, "n7", t0, quiet())
	if err != nil {
		t.Fatal(err)
	}
	var want []Replica
	for p := range uint32(3000) {
		want = append(want, Replica{Partition: p, State: recovery.ReplicaNeedsRejoin})
	}
	want[7].State = recovery.ReplicaLive
	if err := s.SetReplicas(want); err != nil {
		t.Fatal(err)
	}
	bad := []Replica{{Partition: 5000, State: recovery.ReplicaLive}, {Partition: 5001, State: 0}}
	if err := s.SetReplicas(bad); err == nil {
		t.Fatal("invalid state accepted")
	}
	got, err := s.Replicas()
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%d replicas back (%v), want %d", len(got), err, len(want))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetReplicas(want); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after close: %v, want ErrClosed", err)
	}
	s, rep, err := Open(dir, "n7", t0, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rep.Reset != 1 {
		t.Fatalf("report %+v: want the one live replica reset", rep)
	}
}

// TestEpochFence: the highest epoch per partition only grows, is kept by
// Open (which resets every replica's state), and is per partition.
func TestEpochFence(t *testing.T) {
	dir := t.TempDir()
	s, _, err := Open(dir, "n1", t0, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if e, err := s.HighestEpoch(5); err != nil || e != 0 {
		t.Fatalf("no epoch yet: %d, %v", e, err)
	}
	for _, e := range []uint64{10, 10, 12} {
		if err := s.RaiseEpoch(5, e); err != nil {
			t.Fatalf("raise to %d: %v", e, err)
		}
	}
	if err := s.RaiseEpoch(5, 11); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("11 after 12: %v, want ErrStaleEpoch", err)
	}
	if err := s.RaiseEpoch(6, 3); err != nil {
		t.Fatalf("another partition: %v", err)
	}
	if err := s.SetReplica(Replica{Partition: 5, State: recovery.ReplicaRejoining, Epoch: 12}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, rep, err := Open(dir, "n1", t0.Add(time.Minute), quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rep.Reset != 1 {
		t.Fatalf("report %+v", rep)
	}
	for p, want := range map[uint32]uint64{5: 12, 6: 3, 7: 0} {
		if e, err := s.HighestEpoch(p); err != nil || e != want {
			t.Fatalf("partition %d after a restart: epoch %d, %v, want %d", p, e, err, want)
		}
	}
	if err := s.RaiseEpoch(5, 12); err != nil {
		t.Fatalf("the same epoch again: %v", err)
	}
	if err := s.RaiseEpoch(5, 1); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("1 after 12, restarted: %v, want ErrStaleEpoch", err)
	}
	got, err := s.Replicas()
	if err != nil {
		t.Fatal(err)
	}
	if want := []Replica{{Partition: 5, State: recovery.ReplicaNeedsRejoin}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("replicas %v: an epoch key must not read as a replica", got)
	}
	// A first start in another cluster forgets them all, and only them.
	if err := s.ResetEpochs(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint32{5, 6} {
		if e, err := s.HighestEpoch(p); err != nil || e != 0 {
			t.Fatalf("partition %d after the reset: epoch %d, %v", p, e, err)
		}
	}
	if got, err := s.Replicas(); err != nil || len(got) != 1 {
		t.Fatalf("replicas after the epochs' reset: %v, %v", got, err)
	}
	if err := s.RaiseEpoch(5, 1); err != nil {
		t.Fatalf("epoch 1 after the reset: %v", err)
	}
}
