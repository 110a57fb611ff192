//go:build unix

package demo

import (
	"os"
	"syscall"
)

// pauseProcess stops p (SIGSTOP); resumeProcess lets it run again
// (SIGCONT).
func pauseProcess(p *os.Process) error  { return p.Signal(syscall.SIGSTOP) }
func resumeProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
