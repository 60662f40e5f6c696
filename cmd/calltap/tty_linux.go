package main

import "golang.org/x/sys/unix"

// isTTY asks the kernel whether fd is a terminal, as isatty(3) does.
func isTTY(fd uintptr) bool {
	_, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
	return err == nil
}
