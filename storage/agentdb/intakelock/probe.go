// Package intakelock tells whether a live process holds the lock of an
// intake log's folder (intake.LockName), that is whether an agent owns
// the log, without holding the lock itself: a process that only reads a
// store asks it at every open.
package intakelock

import (
	"errors"
	"os"
	"syscall"
)

// probeLock reports whether another process holds the flock of the file
// at path, by taking a shared lock for a moment.
func probeLock(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	return errors.Is(err, syscall.EWOULDBLOCK)
}
