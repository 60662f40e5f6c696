//go:build !linux

package agentdb

import (
	"errors"
	"os"
)

// openSegment creates a segment for writing; O_DIRECT is Linux's.
func openSegment(path string, direct bool) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
}

// holdSegment: locks between processes are not used here; see removeUnheld.
func holdSegment(*os.File) error { return nil }

// removeUnheld never removes a segment here: without the Linux lock there
// is no telling whether another process still appends to it. The spans of
// deleted bodies are left too (releaseSpan).
func removeUnheld(string) (bool, error) { return false, nil }

// releaseSpan: hole punching is Linux's.
func releaseSpan(string, int64, int64) error { return nil }

// allocated is fi's size: holes are not made here.
func allocated(fi os.FileInfo) int64 { return fi.Size() }

// preallocate: reserving blocks without writing them is Linux's
// (fallocate); files grow as they are appended to.
func preallocate(*os.File, int64) error { return errors.ErrUnsupported }
