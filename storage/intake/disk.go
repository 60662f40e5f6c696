package intake

import "os"

// Disk is the file calls a test may stand in for: the log writes its
// frames with WriteAt, and the body store syncs its segments and folder
// with Sync. Production uses OSDisk. A test gives NewLog or NewBodies its
// own (WithDisk) to stop a write halfway, as a disk that fills up does, or
// to watch what is synced and when. It is an option, not a field a test
// sets, so no production value carries a hook a test can reach.
type Disk interface {
	WriteAt(f *os.File, b []byte, off int64) (int, error)
	Sync(f *os.File) error
}

// OSDisk is the operating system's Disk: (*os.File).WriteAt and Sync.
type OSDisk struct{}

// WriteAt is f.WriteAt.
func (OSDisk) WriteAt(f *os.File, b []byte, off int64) (int, error) { return f.WriteAt(b, off) }

// Sync is f.Sync.
func (OSDisk) Sync(f *os.File) error { return f.Sync() }

// Option changes how NewLog or NewBodies makes its value. Production passes
// none; tests pass WithDisk.
type Option func(*config)

type config struct{ disk Disk }

// WithDisk makes the log or the body store write and sync through d in
// place of OSDisk.
func WithDisk(d Disk) Option { return func(c *config) { c.disk = d } }

func newConfig(opts []Option) config {
	c := config{disk: OSDisk{}}
	for _, o := range opts {
		o(&c)
	}
	return c
}
