//go:build !linux && !darwin && !freebsd && !netbsd && !openbsd && !dragonfly

package main

// isTTY is false where calltap cannot ask: a command then behaves as in a
// script (delete wants --yes, no progress line).
func isTTY(uintptr) bool { return false }
