package storage

import (
	"errors"
	"os"
	"syscall"
)

// openSegment creates a segment for writing, with O_DIRECT if direct: its
// bytes then go to the device without passing through the page cache. A
// file system that refuses O_DIRECT (tmpfs) gets a plain file.
func openSegment(path string, direct bool) (*os.File, error) {
	if direct {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_DIRECT, 0o600)
		if !errors.Is(err, syscall.EINVAL) {
			return f, err
		}
		// The refusal may come after the file was made: open it again
		// (segment names are never reused).
		return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	}
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
}
