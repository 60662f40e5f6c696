package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// agentDisk is the agent's own small disk: a size-limited tmpfs, so that
// the nemesis can fill it (a ballast file) and give the room back. Without
// the right to mount (not root), the folder is a plain one and the
// disk-full fault is left out of the schedule.
type agentDisk struct {
	mount   string // the tmpfs's mount point ("" if not mounted)
	data    string // the agent's --data, inside it
	ballast string
}

// agentDiskSize leaves room for many agent starts: each start prefills an
// 8 MiB intake log that stays while its captures are kept, so a 64 MiB disk
// was full for good after some seven restarts (seed 51, single, 10 min) and
// the run measured nothing but an agent that could not start.
const agentDiskSize = "256m"

func newAgentDisk(dir string) (*agentDisk, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d := &agentDisk{data: filepath.Join(dir, "agent"), ballast: filepath.Join(dir, "ballast")}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+agentDiskSize); err == nil {
		d.mount = dir
	}
	return d, os.MkdirAll(d.data, 0o755)
}

// limited reports whether the disk can be filled.
func (d *agentDisk) limited() bool { return d.mount != "" }

// fill writes the ballast until the disk has no more than leave bytes of
// room (none if it cannot tell).
func (d *agentDisk) fill(leave int64) (int64, error) {
	f, err := os.Create(d.ballast)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		var st syscall.Statfs_t
		if syscall.Statfs(d.mount, &st) == nil && int64(st.Bavail)*st.Bsize <= leave {
			return n, nil
		}
		w, err := f.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// free removes the ballast.
func (d *agentDisk) free() error {
	err := os.Remove(d.ballast)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// unmount lets the tmpfs go (its contents with it).
func (d *agentDisk) unmount() {
	if d.mount != "" {
		syscall.Unmount(d.mount, syscall.MNT_DETACH)
		d.mount = ""
	}
}

// tear is what a power cut did to the agent's newest intake log.
type tear struct {
	file      string // "" when no log holds a record
	off, size int64  // the last record's frame
	kind      byte   // its payload's first byte: 1 insert, 2 update
	kept      bool   // left whole: it was synced before the power went
}

// tearLastRecord does to the agent's newest intake log what a power cut
// does to a write the disk had not synced: the second half of the last
// record's frame (storage/agentdb/intakerecord.go: u32 length, u32 CRC-32C,
// payload; a zero length ends the records, the file being prefilled with
// zeros) is zeroed. A record synced says so (synced, given its payload) is
// left whole, as a power cut would leave it.
func tearLastRecord(agentData string, synced func(payload []byte) bool) (tear, error) {
	logs, err := intakeLogs(agentData)
	if err != nil {
		return tear{}, err
	}
	for i := len(logs) - 1; i >= 0; i-- {
		b, err := os.ReadFile(logs[i])
		if err != nil {
			return tear{}, err
		}
		off, size := lastFrame(b)
		if size == 0 {
			continue // a file prefilled for the next generation, still empty
		}
		payload := b[off+8 : off+size]
		t := tear{file: logs[i], off: off, size: size, kind: payload[0], kept: synced(payload)}
		if t.kept {
			return t, nil
		}
		f, err := os.OpenFile(logs[i], os.O_WRONLY, 0)
		if err != nil {
			return t, err
		}
		defer f.Close()
		half := size / 2
		if _, err := f.WriteAt(make([]byte, size-half), off+half); err != nil {
			return t, err
		}
		return t, f.Sync()
	}
	return tear{}, nil
}

// intakeLogs are the agent's intake-<generation>.log files, oldest
// generation first.
func intakeLogs(agentData string) ([]string, error) {
	var logs []string
	err := filepath.WalkDir(agentData, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.IsDir() && strings.HasPrefix(e.Name(), "intake-") && strings.HasSuffix(e.Name(), ".log") {
			logs = append(logs, path)
		}
		return nil
	})
	sort.Slice(logs, func(i, j int) bool { return generation(logs[i]) < generation(logs[j]) })
	return logs, err
}

func generation(path string) int64 {
	s := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "intake-"), ".log")
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// lastFrame walks the frames of an intake log and returns the last whole
// one's offset and size (0 if none).
func lastFrame(b []byte) (off, size int64) {
	var at int64
	for at+8 <= int64(len(b)) {
		n := int64(binary.LittleEndian.Uint32(b[at:]))
		if n == 0 || at+8+n > int64(len(b)) {
			break
		}
		off, size = at, 8+n
		at += 8 + n
	}
	return off, size
}

func (d *agentDisk) String() string {
	if d.mount == "" {
		return fmt.Sprintf("%s (no size limit: not mounted)", d.data)
	}
	return fmt.Sprintf("%s (tmpfs of %s)", d.data, agentDiskSize)
}
