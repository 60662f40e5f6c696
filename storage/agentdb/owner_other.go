//go:build !linux

package agentdb

import (
	"path/filepath"

	"github.com/calltap/calltap/storage/intake"
)

// intakeOwned reports whether a live process holds the intake lock in dir
// (an agent owns the log), by trying it.
func intakeOwned(dir string) bool { return probeLock(filepath.Join(dir, intake.LockName)) }
