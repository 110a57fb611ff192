package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// EtcdReadyPrefix starts the line `rejoin etcd` prints once serving,
// followed by its client URL.
const EtcdReadyPrefix = "ready etcd="

// etcdProc is etcd run as a process of its own (`rejoin etcd`), so a
// fault can pause it (SIGSTOP) apart from the nodes: --fault pause-etcd.
type etcdProc struct {
	cmd      *exec.Cmd
	endpoint string
	done     chan struct{} // closed once Wait returned
	err      error         // Wait's, valid after done
}

// startEtcdProc execs `binary etcd --data dir/etcd`, logging to
// dir/etcd.log, and waits for its ready line (or its exit). With
// certsDir (EnsureCerts's) it serves TLS and requires client
// certificates.
func startEtcdProc(ctx context.Context, binary, dir, certsDir string) (*etcdProc, error) {
	logPath := filepath.Join(dir, "etcd.log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	args := []string{"etcd", "--data", filepath.Join(dir, "etcd")}
	if certsDir != "" {
		args = append(args, "--certs-dir", certsDir)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stderr = lf
	cmd.SysProcAttr = sysProcAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		lf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	e := &etcdProc{cmd: cmd, done: make(chan struct{})}
	readyc := make(chan string, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if ep, ok := strings.CutPrefix(sc.Text(), EtcdReadyPrefix); ok {
				select {
				case readyc <- ep:
				default:
				}
				continue
			}
			fmt.Fprintf(lf, "stdout: %s\n", sc.Text())
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		<-scanned // Wait closes the pipe: read it all first
		e.err = cmd.Wait()
		lf.Close()
		close(e.done)
	}()
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case e.endpoint = <-readyc:
		return e, nil
	case <-e.done:
		return nil, fmt.Errorf("etcd exited before it was ready (%v); see %s", e.err, logPath)
	case <-timer.C:
		e.stop(0)
		return nil, fmt.Errorf("etcd not ready after %s; see %s", readyTimeout, logPath)
	case <-ctx.Done():
		e.stop(0)
		return nil, ctx.Err()
	}
}

func (e *etcdProc) pid() int { return e.cmd.Process.Pid }

// pause stops the process (SIGSTOP, by its pid: our own child); resume
// lets it run again (SIGCONT).
func (e *etcdProc) pause() error  { return pauseProcess(e.cmd.Process) }
func (e *etcdProc) resume() error { return resumeProcess(e.cmd.Process) }

// stop ends the process: SIGCONT (a paused one cannot act on SIGTERM),
// SIGTERM, then SIGKILL after grace (0: at once); it waits for it.
func (e *etcdProc) stop(grace time.Duration) {
	select {
	case <-e.done:
		return
	default:
	}
	_ = e.resume()
	stopChild(e.cmd, e.done, grace)
}

// stopChild ends our child cmd, whose exit closes done: SIGTERM, then
// SIGKILL after grace (0: at once); it waits for the exit.
func stopChild(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) {
	select {
	case <-done:
		return
	default:
	}
	if grace > 0 {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
	_ = cmd.Process.Kill()
	<-done
}
