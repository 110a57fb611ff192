//go:build !unix

package demo

import "syscall"

// setCredential: no Unix users here; chaos never asks for one (its
// network faults need Linux).
func setCredential(a *syscall.SysProcAttr, _, _ uint32) *syscall.SysProcAttr { return a }
