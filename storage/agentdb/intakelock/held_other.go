//go:build !linux

package intakelock

import (
	"path/filepath"

	"github.com/calltap/calltap/storage/intake"
)

// Held reports whether a live process holds the intake lock in dir
// (an agent owns the log), by trying it.
func Held(dir string) bool { return probeLock(filepath.Join(dir, intake.LockName)) }
