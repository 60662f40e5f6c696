package agent

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/calltap/calltap/relay/polltest"
	"github.com/calltap/calltap/storage/agentdb"
)

// lockedBuffer is an io.Writer the console's timer may write to while a
// test reads it.
type lockedBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer // guarded by mu
	writes int          // guarded by mu
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes++
	return l.b.Write(p)
}

func (l *lockedBuffer) read() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String(), l.writes
}

// Console lines are held back and written together, within consoleDelay,
// or at once when consoleMax of them is waiting.
func TestConsoleWritesLinesTogether(t *testing.T) {
	out := &lockedBuffer{}
	c := newConsole(out)
	c.line("one")
	c.line("two")
	if s, _ := out.read(); s != "" {
		t.Fatalf("written at once: %q", s)
	}
	polltest.Until(t, 10*time.Second, func() bool { s, _ := out.read(); return s != "" }, "the lines were never written")
	if s, n := out.read(); s != "one\ntwo\n" || n != 1 {
		t.Fatalf("wrote %q in %d writes, want both lines in one", s, n)
	}
	long := strings.Repeat("x", consoleMax-1)
	c.line(long) // with its newline: consoleMax, written at once
	if s, n := out.read(); n != 2 || len(s) != len("one\ntwo\n")+consoleMax {
		t.Fatalf("a full buffer was not written at once: %d writes, %d bytes", n, len(s))
	}
	c.line("three")
	c.flush()
	if s, n := out.read(); !strings.HasSuffix(s, "\nthree\n") || n != 3 {
		t.Fatalf("flush: %d writes, ending %q", n, s[len(s)-10:])
	}
	c.flush() // nothing held: no write
	if _, n := out.read(); n != 3 {
		t.Errorf("an empty flush wrote: %d writes", n)
	}
}

// A flush with nothing held, or a first line that fills the buffer, finds
// no timer to stop; and every batch gets its own timer: lines that come
// after one was written are written within consoleDelay too, not held
// until the buffer fills.
func TestConsoleWritesLaterLinesInTime(t *testing.T) {
	out := &lockedBuffer{}
	c := newConsole(out)
	c.flush()
	long := strings.Repeat("x", consoleMax-1)
	c.line(long)
	if s, n := out.read(); n != 1 || len(s) != consoleMax {
		t.Fatalf("a first line filling the buffer: %d writes, %d bytes", n, len(s))
	}
	want := long + "\n"
	for _, l := range []string{"one", "two", "three"} {
		c.line(l)
		want += l + "\n"
		polltest.Until(t, 5*time.Second, func() bool { s, _ := out.read(); return s == want }, "line "+l+" to be written")
	}
}

// A request's console line says when, what, its event, the answer's status
// and time, and flags it: queued, duplicate, its source when not the
// tunnel, and its error.
func TestPrintLine(t *testing.T) {
	out := &lockedBuffer{}
	a := &Agent{console: newConsole(out)}
	a.printLine(&agentdb.Capture{Method: "POST", Path: "/hook", Event: "call.ended", ResponseStatus: 201, Duration: 12 * time.Millisecond, Source: SourceTunnel})
	a.printLine(&agentdb.Capture{Method: "GET", Path: "/x", Duration: -1, Queued: true, DuplicateOf: "c1", Source: SourceReplay, Error: "connection refused"})
	a.FlushConsole()
	s, _ := out.read()
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines: %q", len(lines), s)
	}
	first := lines[0][len("15:04:05.000"):]
	if want := "  POST   /hook                            call.ended                 201   12ms"; first != want {
		t.Errorf("line\n%q, want\n%q", first, want)
	}
	second := lines[1][len("15:04:05.000"):]
	if want := "  GET    /x                               -                          ERR      -  [queued,duplicate,replay]  connection refused"; second != want {
		t.Errorf("line\n%q, want\n%q", second, want)
	}
	(&Agent{}).printLine(&agentdb.Capture{}) // no console: nothing, no panic
}

func TestFmtDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-1:                                    "-",
		0:                                     "0µs",
		999 * time.Microsecond:                "999µs",
		time.Millisecond:                      "1ms",
		9999 * time.Millisecond:               "9999ms",
		10 * time.Second:                      "10s",
		12*time.Second + 340*time.Millisecond: "12.3s",
		12*time.Second + 360*time.Millisecond: "12.4s",
	} {
		if got := fmtDuration(d); got != want {
			t.Errorf("fmtDuration(%s) = %q, want %q", d, got, want)
		}
	}
}
