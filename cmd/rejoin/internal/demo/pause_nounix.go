//go:build !unix

package demo

import (
	"errors"
	"os"
)

var errNoPause = errors.New("demo: pausing a process needs SIGSTOP (a unix system)")

func pauseProcess(*os.Process) error  { return errNoPause }
func resumeProcess(*os.Process) error { return nil }
