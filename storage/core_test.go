package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"testing/fstest"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// A file named WithAttached is attached to the read pool, read-only, and
// to the pools Pool opens with it, read-write; it is private like the
// main file. A pool without it does not see it.
func TestAttachedFile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path, extra := filepath.Join(dir, "main.db"), filepath.Join(dir, "extra.db")
	db, err := Open(ctx, path, otherSchema, otherMigrations, WithAttached("extra", extra))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rw := db.Pool("deferred", true)
	defer rw.Close()
	if _, err := rw.ExecContext(ctx, `CREATE TABLE extra.t (v TEXT); INSERT INTO extra.t VALUES ('x')`); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := db.Reader().QueryRowContext(ctx, `SELECT v FROM extra.t`).Scan(&v); err != nil || v != "x" {
		t.Fatalf("the read pool: %q, %v", v, err)
	}
	if _, err := db.Reader().ExecContext(ctx, `INSERT INTO extra.t VALUES ('y')`); err == nil {
		t.Error("the read pool wrote to the attached file")
	}
	plain := db.Pool("immediate", false)
	defer plain.Close()
	if err := plain.QueryRowContext(ctx, `SELECT v FROM extra.t`).Scan(&v); err == nil {
		t.Error("a pool without the attached file read it")
	}
	for _, f := range []string{path, extra} {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v", f, fi.Mode(), err)
		}
	}
}

// OpenReadOnly reads what a writer left, attaches the attached file if it
// is there, writes nothing, and counts the migrations the file lacks.
func TestOpenReadOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path, extra := filepath.Join(dir, "main.db"), filepath.Join(dir, "extra.db")
	db, err := Open(ctx, path, otherSchema, otherMigrations, WithAttached("extra", extra))
	if err != nil {
		t.Fatal(err)
	}
	rw := db.Pool("deferred", true)
	_, err = rw.ExecContext(ctx, `CREATE TABLE extra.t (v TEXT); INSERT INTO extra.t VALUES ('x'); INSERT INTO settings VALUES ('k', 'v')`)
	rw.Close()
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	later := fstest.MapFS{"0003_more.sql": {Data: []byte(`CREATE TABLE more (a);`)}}
	for name, f := range otherMigrations {
		later[name] = f
	}
	for _, immutable := range []bool{false, true} {
		r, err := OpenReadOnly(ctx, path, otherSchema, later, immutable, WithAttached("extra", extra))
		if err != nil {
			t.Fatal(err)
		}
		var v, k string
		if err := r.Reader().QueryRowContext(ctx, `SELECT v FROM extra.t`).Scan(&v); err != nil || v != "x" {
			t.Errorf("immutable %v: the attached file: %q, %v", immutable, v, err)
		}
		if err := r.Reader().QueryRowContext(ctx, `SELECT key FROM settings`).Scan(&k); err != nil || k != "k" {
			t.Errorf("immutable %v: the main file: %q, %v", immutable, k, err)
		}
		if _, err := r.Writer().ExecContext(ctx, `INSERT INTO settings VALUES ('k2', 'v')`); err == nil {
			t.Errorf("immutable %v: wrote through a read-only store", immutable)
		}
		if n, err := r.PendingMigrations(ctx); n != 1 || err != nil {
			t.Errorf("immutable %v: %d migrations pending (%v), want 1", immutable, n, err)
		}
		if r.Path() != path || r.SyncMode() != SyncFull {
			t.Errorf("path %s, mode %s", r.Path(), r.SyncMode())
		}
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}
	os.Remove(extra)
	r, err := OpenReadOnly(ctx, path, otherSchema, otherMigrations, false, WithAttached("extra", extra))
	if err != nil {
		t.Fatalf("without the attached file: %v", err)
	}
	if n, err := r.PendingMigrations(ctx); n != 0 || err != nil {
		t.Errorf("%d migrations pending (%v), want 0", n, err)
	}
	r.Close()
	junk := filepath.Join(dir, "junk.db")
	os.WriteFile(junk, []byte(fmt.Sprintf("%08192d", 7)), 0o600)
	if r, err := OpenReadOnly(ctx, junk, otherSchema, otherMigrations, false); err == nil {
		r.Close()
		t.Error("opened a file that is not a database")
	} else if !errors.Is(err, ErrDamaged) {
		t.Errorf("not a database: %v, want ErrDamaged", err)
	}
}

// A migration marked to run outside a transaction runs once, and is
// recorded as the others are.
func TestMigrationOutsideTx(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "o.db")
	ms := fstest.MapFS{
		"0001_a.sql":      {Data: []byte(`CREATE TABLE a (v);`)},
		"0002_vacuum.sql": {Data: []byte(outsideTx + `INSERT INTO a VALUES (1); VACUUM;`)},
		"notes.txt":       {Data: []byte(`not a migration`)},
	}
	for range 2 {
		db, err := Open(ctx, path, otherSchema, ms)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM a`).Scan(&n)
		var m int
		db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&m)
		db.Close()
		if n != 1 || m != 2 {
			t.Fatalf("rows %d, migrations %d: want 1 and 2", n, m)
		}
	}
	bad := fstest.MapFS{"0001_bad.sql": {Data: []byte(outsideTx + `CREATE TABLE`)}}
	if db, err := Open(ctx, filepath.Join(t.TempDir(), "b.db"), otherSchema, bad); err == nil {
		db.Close()
		t.Error("opened with an outside-a-transaction migration that fails")
	}
}

// Store files wider than 0600 are made private at Open, the -wal and
// -shm too.
func TestOpenTightensFiles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "w.db")
	db, err := Open(ctx, path, otherSchema, otherMigrations)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	os.Chmod(path, 0o644)
	for _, f := range []string{path + "-wal", path + "-shm"} {
		os.WriteFile(f, nil, 0o644)
		os.Chmod(f, 0o644)
	}
	db, err = Open(ctx, path, otherSchema, otherMigrations)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n)
	db.Close()
	if n != 2 {
		t.Fatalf("the store reopened with %d migrations recorded, want 2", n)
	}
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if fi, err := os.Stat(f); err == nil && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s is %v after Open", f, fi.Mode().Perm())
		}
	}
}

// A write refused for want of room is a full disk, whoever said so; other
// errors are not.
func TestIsDiskFull(t *testing.T) {
	for err, want := range map[error]bool{
		nil: false, syscall.ENOSPC: true, fmt.Errorf("x: %w", syscall.EDQUOT): true,
		syscall.EIO: false, errors.New("no space"): false,
		sqlite3.Error{Code: sqlite3.ErrFull}: true, sqlite3.Error{Code: sqlite3.ErrBusy}: false,
	} {
		if IsDiskFull(err) != want {
			t.Errorf("IsDiskFull(%v) = %v", err, !want)
		}
	}
}

// SQLite's damage codes are corruption; other errors are not.
func TestIsCorrupt(t *testing.T) {
	for err, want := range map[error]bool{
		nil: false, sqlite3.Error{Code: sqlite3.ErrCorrupt}: true, sqlite3.Error{Code: sqlite3.ErrNotADB}: true,
		sqlite3.Error{Code: sqlite3.ErrBusy}: false, fmt.Errorf("x: %w", sqlite3.Error{Code: sqlite3.ErrCorrupt}): true,
	} {
		if IsCorrupt(err) != want {
			t.Errorf("IsCorrupt(%v) = %v", err, !want)
		}
	}
}

// The read pool holds two connections a processor, four at least.
func TestReadPoolSize(t *testing.T) {
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), otherSchema, otherMigrations)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got, want := db.Reader().Stats().MaxOpenConnections, max(4, 2*runtime.GOMAXPROCS(0)); got != want {
		t.Errorf("read pool of %d, want %d", got, want)
	}
	if got := db.Writer().Stats().MaxOpenConnections; got != 1 {
		t.Errorf("write pool of %d, want 1", got)
	}
}

// A folder of a writable file system with room is writable; one not known
// is taken as writable (writing says what fails).
func TestWritable(t *testing.T) {
	if !Writable(t.TempDir()) || !Writable(filepath.Join(t.TempDir(), "missing")) {
		t.Error("a temporary folder is not writable")
	}
}
