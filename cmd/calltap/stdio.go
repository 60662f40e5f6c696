package main

import (
	"fmt"
	"io"
	"strings"
)

// What every command shares: its standard streams, the build it is, and
// how it says it failed.

// version is set at build time with -ldflags "-X main.version=…".
var version = "(devel)" // Go's own word for an unstamped build: "dev" read as the command

// Stdio is where a command reads and writes.
type Stdio struct {
	In  io.Reader
	Out io.Writer
	Err io.Writer
}

// fail prints one line for an error that is not a usage error and returns 1.
func fail(stdio Stdio, cmd string, err error) int {
	msg := strings.TrimSpace(err.Error())
	fmt.Fprintf(stdio.Err, "calltap %s: %s\n", cmd, msg)
	return 1
}
