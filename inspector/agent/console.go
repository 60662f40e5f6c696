package agent

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/calltap/calltap/storage/agentdb"
)

// console is the agent's one-line-per-request output. Lines are collected
// and written together a moment later: under load a write per request is a
// system call per request, for lines nobody reads at that pace, while a
// person watching sees them within consoleDelay.
type console struct {
	w io.Writer

	mu      sync.Mutex
	buf     []byte      // guarded by mu: lines not yet written
	pending *time.Timer // guarded by mu: the flush to come; nil when none
}

const (
	consoleDelay = 20 * time.Millisecond
	consoleMax   = 32 << 10 // written at once beyond this
)

func newConsole(w io.Writer) *console { return &console{w: w} }

// line adds one line (without its newline).
func (c *console) line(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(append(c.buf, s...), '\n')
	if len(c.buf) >= consoleMax {
		c.flushLocked()
		return
	}
	if c.pending == nil {
		c.pending = time.AfterFunc(consoleDelay, c.flush)
	}
}

// flush writes what is collected.
func (c *console) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked()
}

func (c *console) flushLocked() {
	if c.pending != nil {
		c.pending.Stop()
		c.pending = nil
	}
	if len(c.buf) > 0 {
		c.w.Write(c.buf)
		c.buf = c.buf[:0]
	}
}

// printLine writes the console line for a finished request.
func (a *Agent) printLine(c *agentdb.Capture) {
	if a.console == nil {
		return
	}
	status := "ERR"
	switch {
	case c.ResponseStatus > 0:
		status = fmt.Sprint(c.ResponseStatus)
	case c.Status == agentdb.StatusStored:
		status = "-"
	}
	event := c.Event
	if event == "" {
		event = "-"
	}
	var flags []string
	if c.Queued {
		flags = append(flags, "queued")
	}
	if c.DuplicateOf != "" {
		flags = append(flags, "duplicate")
	}
	if c.Source != SourceTunnel {
		flags = append(flags, c.Source)
	}
	if c.Status == agentdb.StatusStored {
		flags = append(flags, "stored only")
	}
	if c.Route != "" {
		flags = append(flags, "route "+c.Route)
	}
	line := fmt.Sprintf("%s  %-6s %-32s %-26s %3s %6s", time.Now().Format("15:04:05.000"), c.Method, c.Path, event, status, fmtDuration(c.Duration))
	if len(flags) > 0 {
		line += "  [" + strings.Join(flags, ",") + "]"
	}
	if c.Error != "" {
		line += "  " + c.Error
	}
	a.console.line(line)
}

func fmtDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < 10*time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	default:
		return d.Round(100 * time.Millisecond).String()
	}
}
