package agent

import (
	"context"

	"github.com/calltap/calltap/storage"
)

// SetWriteCaptures makes the agent built from c commit its captures through
// f, which may fail a commit the way a full disk does.
func SetWriteCaptures(c *Config, f func(ctx context.Context, inserts, updates []*storage.Capture) ([]storage.Written, error)) {
	c.writeCaptures = f
}
