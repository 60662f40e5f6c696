//go:build !linux

package intake

import (
	"errors"
	"os"
)

// openSegment creates a segment for writing; O_DIRECT is Linux's.
func openSegment(path string, direct bool) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
}

// HoldSegment: locks between processes are not used here; see RemoveUnheld.
func HoldSegment(*os.File) error { return nil }

// RemoveUnheld never removes a segment here: without the Linux lock there
// is no telling whether another process still appends to it. The spans of
// deleted bodies are left too (ReleaseSpan).
func RemoveUnheld(string) (bool, error) { return false, nil }

// ReleaseSpan: hole punching is Linux's.
func ReleaseSpan(string, int64, int64) error { return nil }

// Allocated is fi's size: holes are not made here.
func Allocated(fi os.FileInfo) int64 { return fi.Size() }

// preallocate: reserving blocks without writing them is Linux's
// (fallocate); files grow as they are appended to.
func preallocate(*os.File, int64) error { return errors.ErrUnsupported }
