package agentdb

import (
	"context"
	"database/sql"
	"io/fs"
	"sort"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/calltap/calltap/storage"
)

// otherSchema stands for a database that a package of its own keeps (the
// relay's, the emulated service's), opened with storage.Open: the core's
// rules the agent's tests check hold for it too.
const otherSchema storage.Schema = "other"

// otherMigrations are otherSchema's migrations.
var otherMigrations = fstest.MapFS{
	"0001_settings.sql": {Data: []byte(`CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);`)},
}

// openOther opens a database of otherSchema at path.
func openOther(ctx context.Context, path string, opts ...storage.Option) (*storage.DB, error) {
	return storage.Open(ctx, path, otherSchema, otherMigrations, opts...)
}

// migrateThrough applies to w the agent's migrations up to and including
// the file named last, and records them as storage.Open does: a database
// of an older schema.
func migrateThrough(t *testing.T, w *sql.DB, last string) {
	t.Helper()
	ctx := context.Background()
	if _, err := w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	names, err := fs.Glob(migrations, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	for _, name := range names {
		if name > last {
			break
		}
		body, err := fs.ReadFile(migrations, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.ExecContext(ctx, strings.TrimPrefix(string(body), "-- calltap: outside a transaction\n")); err != nil {
			t.Fatalf("migration %s: %v", name, err)
		}
		if _, err := w.ExecContext(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)`, name, time.Now().UTC().Format(time.RFC3339)); err != nil {
			t.Fatal(err)
		}
	}
}

// logSize is where the next frame goes in the intake log appended to.
func logSize(db *AgentStore) int64 {
	_, off := db.intake.log.End()
	return off
}
