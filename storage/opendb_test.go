package storage

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// otherSchema stands for a database that a package of its own keeps (the
// relay's, the emulated service's), opened with Open.
const otherSchema Schema = "other"

// otherMigrations are otherSchema's migrations.
var otherMigrations = fstest.MapFS{
	"0001_settings.sql": {Data: []byte(`CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);`)},
	"0002_queue.sql":    {Data: []byte(`CREATE TABLE queue (seq INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB NOT NULL);`)},
}

// openOther opens a database of otherSchema at path.
func openOther(ctx context.Context, path string, opts ...Option) (*DB, error) {
	return Open(ctx, path, otherSchema, otherMigrations, opts...)
}

// Open applies the caller's migrations in file-name order, each once: a
// migration added later is applied at the next open, and the earlier ones
// are not run again (they would fail: their tables exist).
func TestOpenAppliesCallersMigrations(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "other.db")
	db, err := openOther(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Writer().ExecContext(ctx, `INSERT INTO queue (body) VALUES (x'00')`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	later := fstest.MapFS{"0003_queue_size.sql": {Data: []byte(`ALTER TABLE queue ADD COLUMN size INTEGER NOT NULL DEFAULT 0;`)}}
	for name, f := range otherMigrations {
		later[name] = f
	}
	db, err = Open(ctx, path, otherSchema, later)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var applied []string
	rows, err := db.Reader().QueryContext(ctx, `SELECT name FROM schema_migrations ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		applied = append(applied, name)
	}
	if got := strings.Join(applied, " "); got != "0001_settings.sql 0002_queue.sql 0003_queue_size.sql" {
		t.Errorf("applied %s", got)
	}
	var size int
	if err := db.Reader().QueryRowContext(ctx, `SELECT size FROM queue`).Scan(&size); err != nil {
		t.Fatalf("the row kept through the migration: %v", err)
	}

	bad := fstest.MapFS{"0001_bad.sql": {Data: []byte(`CREATE TABLE`)}}
	if db, err := Open(ctx, filepath.Join(t.TempDir(), "bad.db"), otherSchema, bad); err == nil {
		db.Close()
		t.Error("opened with a migration that fails")
	} else if !strings.Contains(err.Error(), "other/0001_bad.sql") {
		t.Errorf("a failed migration: %v, want it named", err)
	}
}

// SQLite took the option that keeps the writer and the indexer off a
// shared mutex (sqliteconfig.go): it was set before SQLite initialised.
func TestSQLiteMemstatusOff(t *testing.T) {
	if memstatusOff != 0 {
		t.Fatalf("sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) = %d, want SQLITE_OK", memstatusOff)
	}
}
