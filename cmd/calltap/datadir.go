package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/calltap/calltap/storage"
)

// The data directory of an agent holds the client's secret header and
// every contact's name, phone and email: it is its owner's alone (0700,
// its files 0600), and one agent at a time writes it.

// agentLockFile, in the data directory, is the file whose flock marks the
// directory as held by a running agent (dev, listen). The kernel drops the
// lock when the holder's process ends, however it ends, so a crash never
// leaves a stale lock; the file itself stays, and says who held it last.
const agentLockFile = "agent.lock"

// dataLock is a data directory held by this process.
type dataLock struct {
	f *os.File // open for the process's life; its flock is the hold
}

// holdDataDir makes dir private (creating it if needed) and takes it for
// this process, whose command is what (e.g. "calltap dev"). Another live
// holder is an error naming its pid and command.
func holdDataDir(dir, what string, log *slog.Logger) (*dataLock, error) {
	if err := storage.PrivateDir(dir, log); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, agentLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("the data directory %s is in use by %s; stop it first, or give this one another --data", dir, holder(path))
		}
		return nil, fmt.Errorf("data directory lock %s: %w", path, err)
	}
	// Who holds it, for the next one to name. Written after the lock is
	// taken: holder waits for it.
	info := fmt.Sprintf("%d\n%s\n%s\n", os.Getpid(), what, time.Now().Format(time.DateTime))
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(info), 0)
	}
	if err != nil {
		// The hold is the flock; the file only names the holder.
		log.Warn("could not record this process in the data directory's lock file", "path", path, "err", err)
	}
	return &dataLock{f: f}, nil
}

// release lets the directory go. The file stays: deleting it would let a
// process that opened it before the deletion lock a file nobody else sees.
func (l *dataLock) release() error {
	if l == nil {
		return nil
	}
	return l.f.Close()
}

// holder names the process holding the lock file at path, as it wrote
// itself there: "calltap dev (pid 123, since 2026-11-26 22:41:03)". A
// holder that has only just taken the lock may not have written yet: it
// is given a moment.
func holder(path string) string {
	deadline := time.Now().Add(time.Second)
	for {
		b, err := os.ReadFile(path)
		lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
		if err == nil && len(lines) >= 3 {
			if pid, err := strconv.Atoi(string(lines[0])); err == nil {
				return fmt.Sprintf("%s (pid %d, since %s)", lines[1], pid, lines[2])
			}
		}
		if time.Now().After(deadline) {
			return "another calltap process"
		}
		time.Sleep(10 * time.Millisecond)
	}
}
