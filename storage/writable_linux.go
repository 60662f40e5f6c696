package storage

import "syscall"

// Writable reports whether files in dir can be written: its file system
// is not read-only and has room (a megabyte: SQLite's shared-memory file
// and a commit's pages).
func Writable(dir string) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return true // not known: writing is tried, and says what fails
	}
	const stRdonly = 1 // ST_RDONLY
	return st.Flags&stRdonly == 0 && uint64(st.Bavail)*uint64(st.Bsize) >= 1<<20
}
