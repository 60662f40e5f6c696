package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
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

// A file that is not a database at all is refused at Open the same way.
func TestOpenExplainsNotADatabase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.db")
	if err := os.WriteFile(path, bytes.Repeat([]byte("not a database "), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := openOther(context.Background(), path)
	if err == nil {
		db.Close()
		t.Fatal("opened a file that is not a database")
	}
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) {
		t.Fatalf("error %v: want ErrDamaged naming %s", err, path)
	}
}

// journalHeader is the start of a rollback journal whose transaction began
// on a database of pages pages.
func journalHeader(pages uint32) []byte {
	h := []byte{0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 16, 0}
	binary.BigEndian.PutUint32(h[16:20], pages)
	return h
}

// An empty store file beside a journal of a transaction that began on an
// empty database, or beside an empty WAL, is a store being created (by a
// process killed while creating it, or by another one opening it at the
// same moment): it is opened. A journal of a transaction that began on a
// store with pages shows the file was emptied: refused.
func TestOpenTellsCreatedFromEmptied(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		companion string
		content   []byte
		refused   bool
	}{
		{"journal of a new store", "-journal", journalHeader(0), false},
		{"journal being written", "-journal", nil, false},
		{"empty WAL", "-wal", nil, false},
		{"journal of a store with pages", "-journal", journalHeader(3), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "relay.db")
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path+tc.companion, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			db, err := openOther(ctx, path)
			if err == nil {
				db.Close()
			}
			if tc.refused != errors.Is(err, ErrDamaged) {
				t.Errorf("Open: %v, want refused %v", err, tc.refused)
			}
		})
	}
}

// Two processes opening the same new store at once (the relay starting
// while `relay token create` runs) both succeed.
func TestConcurrentOpensOfNewStore(t *testing.T) {
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		path := filepath.Join(t.TempDir(), "relay.db")
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				db, err := openOther(ctx, path)
				if err == nil {
					err = db.Close()
				}
				errs <- err
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
	}
}
