// Package disktest gives tests size-limited tmpfs folders: a real file
// system that fills up, for tests of what a full disk does. Mounting needs
// root (CI and the development machines run tests as root); a test that
// uses it fails, never skips, when it cannot mount.
package disktest

import "testing"

// Dir mounts a tmpfs of size bytes on a fresh folder and returns the
// folder; it is unmounted when the test ends. Not root, or not Linux: the
// test fails, saying how to run it.
func Dir(t testing.TB, size int64) string {
	t.Helper()
	return mount(t, size)
}

// Fill takes the free space of the file system holding dir, down to
// leave bytes (rounded down to its block size), with a file in dir. free
// gives the space back; it is also given back when the test ends.
func Fill(t testing.TB, dir string, leave int64) (free func()) {
	t.Helper()
	return fill(t, dir, leave)
}

// Free is the bytes an unprivileged writer may still allocate on the file
// system holding dir.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	return available(t, dir)
}
