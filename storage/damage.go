package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// A database file can be damaged from outside: truncated by a copy that
// failed or a disk that filled, or overwritten in places. SQLite reports
// the second as SQLITE_CORRUPT or SQLITE_NOTADB when it reads a damaged
// page, which may be long after Open: finding every damaged page means
// reading every page (PRAGMA quick_check), which on a large store costs
// as much as reading the whole file at each start. So Open checks what is
// cheap (the file's size, its header and schema, which every open reads),
// and the queries map SQLite's corruption errors to a *DamagedError that
// names the file and says how to recover what it holds.
//
// The first is not an error to SQLite: it opens a zero-length file as an
// empty database, and deletes the WAL it finds beside one. A store is
// only taken as new when nothing of it exists beside the empty file (see
// emptyStore).

// ErrDamaged is matched (errors.Is) by every *DamagedError.
var ErrDamaged = errors.New("database file damaged")

// DamagedError is a database file calltap cannot read as it wrote it.
type DamagedError struct {
	Path   string // the file
	Advice string // what the user can do, a sentence or two
	Err    error  // what SQLite or the file system said
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("storage: %s is damaged (%v). %s", e.Path, e.Err, e.Advice)
}

func (e *DamagedError) Unwrap() []error { return []error{ErrDamaged, e.Err} }

// APIError is how an API answers a request that met the damage: the
// message is meant for the user of the machine the store is on.
func (e *DamagedError) APIError() (status int, code, message string) {
	return 500, "store_damaged", e.Error() // api.CodeStoreDamaged
}

// RecoverAdvice is what to do with a damaged database that holds data of
// its own (not the derived search index).
func RecoverAdvice(path string) string {
	return fmt.Sprintf("Stop calltap, keep a copy of the file, and recover what it holds with: sqlite3 %s .recover > dump.sql "+
		"(then move the damaged file aside and load the dump: sqlite3 %s < dump.sql).", path, path)
}

// IsCorrupt reports whether err is SQLite finding a file damaged.
func IsCorrupt(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && (se.Code == sqlite3.ErrCorrupt || se.Code == sqlite3.ErrNotADB)
}

// companions are the files a database at path leaves beside itself once
// it has been written, and the store's parts (WithAttached, WithPart).
func companions(path string, parts []string) []string {
	return append([]string{path + "-wal", path + "-journal"}, parts...)
}

// heldData reports whether the companion file c shows that the database
// beside it held data. A rollback journal whose header says the database
// was empty when its transaction began, or one not yet (or no longer)
// valid, belongs to a store being created — by another process opening
// the same new store at this moment, or by one killed while creating it —
// and a WAL with no frame holds nothing either.
func heldData(c string) bool {
	fi, err := os.Stat(c)
	if err != nil {
		return false
	}
	switch {
	case strings.HasSuffix(c, "-journal"):
		f, err := os.Open(c)
		if err != nil {
			return true
		}
		defer f.Close()
		var h [28]byte
		if _, err := io.ReadFull(f, h[:]); err != nil {
			return false
		}
		// Header: 8 magic bytes, then big-endian page count, nonce and
		// the database's size in pages when the transaction began.
		magic := [8]byte{0xd9, 0xd5, 0x05, 0xf9, 0x20, 0xa1, 0x63, 0xd7}
		return [8]byte(h[:8]) == magic && binary.BigEndian.Uint32(h[16:20]) > 0
	case strings.HasSuffix(c, "-wal"):
		const walHeader, frameHeader = 32, 24
		return fi.Size() > walHeader+frameHeader
	}
	return true
}

// checkEmpty refuses a database file of zero bytes when anything of a
// store that was written exists beside it: the file was emptied, and
// opening it would start a new store (and SQLite would delete the WAL).
// A missing file, or an empty one alone (a first start that stopped
// before SQLite wrote its first page), is a new store.
func checkEmpty(path string, parts []string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	if fi.Size() > 0 || !fi.Mode().IsRegular() {
		return nil
	}
	var found []string
	for _, c := range companions(path, parts) {
		if heldData(c) {
			found = append(found, filepath.Base(c))
		}
	}
	if len(found) == 0 {
		return nil
	}
	return &DamagedError{Path: path, Err: fmt.Errorf("0 bytes, beside %s of the store it held", strings.Join(found, ", ")),
		Advice: fmt.Sprintf("Restore %s from a backup, or move the data directory aside to start an empty store; "+
			"calltap does not start over on its own.", filepath.Base(path))}
}
