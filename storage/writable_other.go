//go:build !linux

package storage

// Writable reports whether files in dir can be written; not known here,
// so writing is tried, and says what fails.
func Writable(dir string) bool { return true }
