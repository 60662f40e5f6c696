package intake

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

// HoldSegment marks f, a segment this process appends to, as in use for as
// long as it is open: a shared lock, which a deletion in any process (or
// this one, through another descriptor) sees and then leaves the file be.
func HoldSegment(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
}

// RemoveUnheld deletes the segment at path unless a process holds it
// (HoldSegment): no body will be appended to it any more, so once no
// capture names it, nothing ever reads it again. It reports whether it did.
func RemoveUnheld(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	// Unlinked while locked: a process that opens it to append after this
	// point cannot exist (only its creator appends, and holds it).
	return true, os.Remove(path)
}

// Hole-punching modes of fallocate(2), from linux/falloc.h.
const (
	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
)

// ReleaseSpan gives the blocks of n bytes at off in the segment at path
// back to the file system (a hole: the file keeps its size, reads of the
// span return zeros). A file system that cannot punch holes keeps them
// until the whole segment is removed.
func ReleaseSpan(path string, off, n int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	n = (n + directAlign - 1) &^ (directAlign - 1)
	err = syscall.Fallocate(int(f.Fd()), fallocPunchHole|fallocKeepSize, off, n)
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		return nil
	}
	return err
}

// Allocated is the bytes fi's blocks take on disk: less than its size
// where deleted bodies left holes.
func Allocated(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// preallocate gives f blocks for its first n bytes without writing them
// (fallocate(2)), if that leaves as much again free for everything else
// (SQLite's commits first): a reservation must never be what fills the
// disk.
func preallocate(f *os.File, n int64) error {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
		return err
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < 2*n {
		return syscall.ENOSPC
	}
	return syscall.Fallocate(int(f.Fd()), 0, 0, n)
}
