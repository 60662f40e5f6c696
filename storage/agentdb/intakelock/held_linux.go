package intakelock

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/calltap/calltap/storage/intake"
)

// Held reports whether a live process holds the intake lock in dir
// (an agent owns the log). It asks the kernel's list of locks rather than
// trying the lock: a reader holding it even for a moment could make an
// agent starting at that moment think another agent owns the log.
func Held(dir string) bool {
	path := filepath.Join(dir, intake.LockName)
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return false // no lock file: no agent ever owned this store's log
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return probeLock(path)
	}
	defer f.Close()
	dev := uint64(st.Dev)
	major := (dev>>8)&0xfff | (dev>>32)&^uint64(0xfff)
	minor := dev&0xff | (dev>>12)&^uint64(0xff)
	id := fmt.Sprintf("%02x:%02x:%d", major, minor, st.Ino)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 1234 08:02:5678 0 EOF"; waiters
		// have "->" after the number.
		fields := strings.Fields(strings.Replace(sc.Text(), "->", "", 1))
		if len(fields) >= 6 && fields[1] == "FLOCK" && fields[5] == id {
			return true
		}
	}
	return false
}
