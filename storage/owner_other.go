//go:build !linux

package storage

import "path/filepath"

// intakeOwned reports whether a live process holds the intake lock in dir
// (an agent owns the log), by trying it.
func intakeOwned(dir string) bool { return probeLock(filepath.Join(dir, intakePrefix+"lock")) }

// Writable reports whether files in dir can be written; not known here,
// so writing is tried, and says what fails.
func Writable(dir string) bool { return true }
