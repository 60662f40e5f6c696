package agentdb

import (
	"errors"
	"io/fs"

	"github.com/calltap/calltap/storage/intake"
)

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

// removeSegmentIfUnused removes segment name when no capture names it and
// no process appends to it.
func (db *AgentStore) removeSegmentIfUnused(name string) error {
	var n int
	if err := db.read.QueryRow(`SELECT count(*) FROM (SELECT 1 FROM capture_bodies WHERE file = ? LIMIT 1)`, name).Scan(&n); err != nil || n > 0 {
		return err
	}
	path, err := intake.SegmentPath(BodiesDir(db.path), name)
	if err != nil {
		return err
	}
	_, err = intake.RemoveUnheld(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
