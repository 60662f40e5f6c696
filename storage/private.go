package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
)

// A store holds secrets (a client's header, contacts' names and numbers):
// its files are its owner's alone, 0600. SQLite creates a database file
// with 0644 less the umask, and its -wal and -shm files with the mode of
// the database file: so the database file is made here, 0600, before
// SQLite opens it, and an older store's files (0644) are tightened.

// privateFiles creates the database files of a store at path that do not
// exist yet, empty and 0600, and makes 0600 those that are wider.
// attached is a second database file of the store ("": none).
func privateFiles(path, attached string) error {
	files := []string{path}
	if attached != "" {
		files = append(files, attached)
	}
	for _, f := range files {
		if err := privateFile(f, true); err != nil {
			return err
		}
		for _, suffix := range []string{"-wal", "-shm"} {
			if err := privateFile(f+suffix, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// privateFile makes the file at path 0600, creating it empty if create
// and it does not exist.
func privateFile(path string, create bool) error {
	if create {
		f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			return f.Close()
		}
		if !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("storage: create %s: %w", path, err)
		}
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("storage: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			// Its folder (0700) still keeps others out.
			slog.Warn("storage: a store file is open to other users and could not be made private", "path", path, "mode", fmt.Sprintf("%04o", perm), "err", err)
		}
	}
	return nil
}

// PrivateDir creates dir 0700, or makes it so: a directory others can
// read or enter is tightened, with one warning. Tightened rather than
// left: the store holds secrets, and a warning alone leaves them open
// until someone acts on it; the directory's mode is enough to close every
// path to the files inside.
func PrivateDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			log.Warn("the data directory is open to other users and could not be made private", "dir", dir, "mode", fmt.Sprintf("%04o", perm), "err", err)
			return nil
		}
		log.Warn("the data directory was open to other users: made it private (0700)", "dir", dir, "was", fmt.Sprintf("%04o", perm))
	}
	return nil
}
