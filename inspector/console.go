package inspector

import (
	"io"
	"sync"
	"time"
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
