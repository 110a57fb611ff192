//go:build !unix

package demo

import "syscall"

// sysProcAttr: no process groups here; the demo still stops its nodes.
func sysProcAttr() *syscall.SysProcAttr { return nil }
