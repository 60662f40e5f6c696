package agentdb

import (
	"os"
	"sync"
	"time"

	"github.com/calltap/calltap/storage/agentdb/searchindex"
	"github.com/calltap/calltap/storage/intake"
)

// withDisk makes the store write and sync its intake log and body files
// through d: the option only tests have.
func withDisk(d intake.Disk) Option { return func(o *options) { o.disk = d } }

// faultDisk is the intake's file calls with a test's hand on them: where
// the test set writeAt or sync (setWriteAt, setSync), they take the place
// of the operating system's, from the next call on.
type faultDisk struct {
	mu      sync.Mutex
	writeAt func(f *os.File, b []byte, off int64) (int, error) // guarded by mu
	sync    func(f *os.File) error                             // guarded by mu
}

func (d *faultDisk) setWriteAt(w func(f *os.File, b []byte, off int64) (int, error)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writeAt = w
}

func (d *faultDisk) setSync(s func(f *os.File) error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sync = s
}

func (d *faultDisk) WriteAt(f *os.File, b []byte, off int64) (int, error) {
	d.mu.Lock()
	w := d.writeAt
	d.mu.Unlock()
	if w == nil {
		return intake.OSDisk{}.WriteAt(f, b, off)
	}
	return w(f, b, off)
}

func (d *faultDisk) Sync(f *os.File) error {
	d.mu.Lock()
	s := d.sync
	d.mu.Unlock()
	if s == nil {
		return intake.OSDisk{}.Sync(f)
	}
	return s(f)
}

// withPace sets how the store's search index keeps pace with its writer.
func withPace(set func(*searchindex.Pace)) Option { return func(o *options) { set(&o.pace) } }

// withApplyDelay sets how long the first pending record of the intake log
// waits, at most, to be applied.
func withApplyDelay(d time.Duration) Option { return func(o *options) { o.delay = d } }
