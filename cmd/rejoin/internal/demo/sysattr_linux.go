package demo

import "syscall"

// sysProcAttr puts a node in its own process group, so a Ctrl-C in the
// terminal reaches the demo only (which then stops its nodes itself), and
// kills it if the demo dies without stopping it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
