package intake

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// A reserve file is room set aside while the disk has it, for records
// that must be written when it may not: its blocks are written (as zeros)
// when it is made, so writing into them later needs no new room. It holds
// frames as the log's, from its start, ended by a zero frame; it is never
// shrunk, so that it stays allocated. storage/agentdb's answer reserve is
// one (what its records mean is agentdb's).

// ReserveSize is a reserve file's size.
const ReserveSize = 1 << 20

// MakeReserve makes the reserve file at path, unless it is there already:
// ReserveSize zero bytes, synced, made only while at least three times as
// much again is free (a reserve must never be what fills the disk); with
// less free it makes none and says so (syscall.ENOSPC).
func MakeReserve(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.Size() >= ReserveSize {
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
		return err
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < 4*ReserveSize {
		return fmt.Errorf("%d bytes free: %w", free, syscall.ENOSPC)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, ReserveSize), 0); err != nil {
		os.Remove(path) // a partial reserve would promise room it lacks
		return err
	}
	return f.Sync()
}

// FillReserve writes the frames of n payloads (encode appends the i-th to
// b) into the reserve file at path, over what it held, then the zero frame
// that ends them, and syncs it. It writes those that fit, in order, and
// returns how many.
func FillReserve(path string, n int, encode func(i int, b []byte) []byte) (int, error) {
	var buf []byte
	wrote := 0
	for i := range n {
		next, _ := AppendFrame(buf, func(b []byte) []byte { return encode(i, b) })
		if len(next)+8 > ReserveSize { // and room for the zero frame
			break
		}
		buf, wrote = next, wrote+1
	}
	if err := writeReserve(path, append(buf, make([]byte, 8)...)); err != nil {
		return 0, err
	}
	return wrote, nil
}

// EmptyReserve ends the reserve file at path at its start (the zero
// frame), synced.
func EmptyReserve(path string) error { return writeReserve(path, make([]byte, 8)) }

// writeReserve writes data at the start of the reserve file at path, which
// must be there, and syncs it.
func writeReserve(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		return err
	}
	return f.Sync()
}

// ReadReserve returns the payloads the reserve file at path holds, in
// order; none when there is no file.
func ReadReserve(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	return reserved(data), nil
}

// reserved are the payloads of the frames at the start of data, up to the
// zero frame that ends them (or a frame that does not hold: a write cut
// short).
func reserved(data []byte) [][]byte {
	var recs [][]byte
	for off := int64(0); ; {
		n, ok := FrameAt(data, off)
		if !ok {
			return recs
		}
		recs = append(recs, data[off+8:off+8+n])
		off += 8 + n
	}
}
