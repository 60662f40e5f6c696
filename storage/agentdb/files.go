package agentdb

import (
	"path/filepath"
	"strings"

	"github.com/calltap/calltap/storage/agentdb/searchindex"
)

// Where an agent store's other files lie, given its database file's path:
// its large bodies, its full-text index and its media.

// BodiesDir is the folder of large request bodies of the agent store at
// path: agent-bodies for agent.db.
func BodiesDir(path string) string {
	return strings.TrimSuffix(path, ".db") + "-bodies"
}

// SearchIndexPath is the full-text index file of the agent store at path:
// agent-search.db for agent.db. It can be deleted; it is rebuilt.
func SearchIndexPath(path string) string { return searchindex.Path(path) }

// MediaDir is the folder of saved recordings and transcripts of the agent
// store at path: media beside agent.db.
func MediaDir(path string) string { return filepath.Join(filepath.Dir(path), "media") }
