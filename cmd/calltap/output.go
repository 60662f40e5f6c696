package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"
)

// What commands write besides their results: a status line on a terminal,
// logs, blanks.

// isTerminal reports whether v (stdin or stdout) is a terminal: where
// progress is shown, and a person can answer a prompt. A character device
// is not enough: /dev/null is one, and a prompt there answers itself.
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	return ok && isTTY(f.Fd())
}

// statusLine rewrites one line of progress on a terminal; elsewhere it
// writes nothing.
type statusLine struct {
	w    io.Writer
	on   bool
	last time.Time
	wide int
}

func newStatusLine(w io.Writer) *statusLine { return &statusLine{w: w, on: isTerminal(w)} }

// show draws s, at most every 100 ms unless force.
func (l *statusLine) show(s string, force bool) {
	if !l.on || !force && time.Since(l.last) < 100*time.Millisecond {
		return
	}
	l.last = time.Now()
	pad := max(l.wide-len(s), 0)
	l.wide = len(s)
	fmt.Fprintf(l.w, "\r%s%s", s, strings.Repeat(" ", pad))
}

// done ends the progress line.
func (l *statusLine) done() {
	if l.on && l.wide > 0 {
		fmt.Fprintf(l.w, "\r%s\r", strings.Repeat(" ", l.wide))
		l.wide = 0
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newLogger(stdio Stdio, asJSON, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return newLevelLogger(stdio, asJSON, level)
}

// newLevelLogger logs to stderr from level up, as JSON or text.
func newLevelLogger(stdio Stdio, asJSON bool, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if asJSON {
		return slog.New(slog.NewJSONHandler(stdio.Err, opts))
	}
	return slog.New(slog.NewTextHandler(stdio.Err, opts))
}

func orPlaceholder(s, p string) string {
	if s == "" {
		return p
	}
	return s
}
