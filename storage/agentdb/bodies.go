package agentdb

import (
	"strings"

	"github.com/calltap/calltap/storage/intake"
)

// BodiesDir is the folder of large request bodies of the agent store at
// path: agent-bodies for agent.db.
func BodiesDir(path string) string {
	return strings.TrimSuffix(path, ".db") + "-bodies"
}

// StageBody writes c's body to a segment now, if it is kept apart, from
// the caller's goroutine; WriteCaptures then only records where it is.
// WriteCaptures and LogCaptures write an unstaged body themselves (the
// insert step's stageBody).
func (db *AgentStore) StageBody(c *Capture) error { return stageBody(db.bodies, c) }

// readFileBody reads a body kept in a segment of this store.
func (db *AgentStore) readFileBody(name string, offset, size int64) ([]byte, error) {
	return intake.ReadBody(BodiesDir(db.path), name, offset, size)
}

// KeptApart reports whether a request body of n bytes is kept out of the
// database, in a body segment (intake.KeptApart): the agent stages those
// (StageBody).
func KeptApart(n int) bool { return intake.KeptApart(n) }
