//go:build unix

package demo

import "syscall"

// setCredential makes the process run as uid:gid (no supplementary
// groups). Go sets the parent-death signal after the change of user, so
// Pdeathsig still holds.
func setCredential(a *syscall.SysProcAttr, uid, gid uint32) *syscall.SysProcAttr {
	if a == nil {
		a = &syscall.SysProcAttr{}
	}
	a.Credential = &syscall.Credential{Uid: uid, Gid: gid}
	return a
}
