package storage

import (
	"errors"
	"os"
	"syscall"
)

// openSegment creates a segment for writing with O_DIRECT: its bytes go to
// the device without passing through the page cache. A file system that
// refuses O_DIRECT (tmpfs) gets a plain file.
func openSegment(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_DIRECT, 0o600)
	if errors.Is(err, syscall.EINVAL) {
		return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	return f, err
}
