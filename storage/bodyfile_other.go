//go:build !linux

package storage

import "os"

// openSegment creates a segment for writing; O_DIRECT is Linux's.
func openSegment(path string, direct bool) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
}
