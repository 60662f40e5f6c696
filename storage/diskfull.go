package storage

import (
	"errors"
	"syscall"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// IsDiskFull reports whether err is a write refused for want of room: the
// file system's ENOSPC (or EDQUOT, a quota's), or SQLite's SQLITE_FULL.
// The agent refuses requests, naming the cause, while its saves fail so.
func IsDiskFull(err error) bool {
	var se sqlite3.Error
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		errors.As(err, &se) && se.Code == sqlite3.ErrFull
}
