package routes

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"time"
)

// WatchEvery is how often Watch reads the route file: a change is taken
// within it (and the promise is 2 s).
const WatchEvery = 500 * time.Millisecond

// Watch reads the route file at path every WatchEvery until ctx ends, and
// when its contents change, checks them with opts: a good file's table
// goes to took, a bad one's error (its file and line) to refused, and the
// table in use stays. A file that cannot be read is refused too, once
// until it changes again. loaded is the contents the table in use came
// from. Contents, not times, are compared: an editor's save within one
// tick of the clock is still seen, and a save that changes nothing is
// not a reload.
func Watch(ctx context.Context, path string, loaded []byte, took func(*Table), refused func(error), opts ...Option) {
	last := loaded
	var lastErr string
	t := time.NewTicker(WatchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		data, err := os.ReadFile(path)
		if err != nil {
			if err.Error() != lastErr {
				lastErr = err.Error()
				refused(err)
			}
			continue
		}
		if bytes.Equal(data, last) {
			continue
		}
		last, lastErr = data, ""
		table, err := Parse(filepath.Base(path), data, opts...)
		if err != nil {
			refused(err)
			continue
		}
		took(table)
	}
}

// LoadBytes reads and checks the route file at path as Load does, and
// returns its contents too, for Watch.
func LoadBytes(path string, opts ...Option) (*Table, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	t, err := Parse(filepath.Base(path), data, opts...)
	return t, data, err
}
