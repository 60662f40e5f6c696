package agentdb

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/calltap/calltap/storage/intake"
)

// The answer reserve: room the agent sets aside at its start for the
// handler's answers it has passed on to their senders but could not
// record when it stops, the disk being full. The agent answers a sender
// before it records the answer (one sync per request, not two), so a disk
// that fills in between leaves answers only in memory; an orderly stop
// writes them here, into blocks written at the start, which needs no
// room, and the next start records them (RecoverAnswers). Without it they
// would be lost, and their captures marked answer-unknown.
//
// The file (answers.reserve, among the body files) holds records framed
// as the intake log's (updates only), ended by a zero frame; it is never
// shrunk, so that it stays allocated.

// answerReserveSize is the reserve's size: thousands of answers of the
// usual size (a short JSON body).
const answerReserveSize = 1 << 20

func (db *AgentStore) answerReservePath() string {
	return filepath.Join(BodiesDir(db.path), "answers.reserve")
}

// ReserveAnswers makes the answer reserve, unless it is there already: a
// file of answerReserveSize zero bytes, synced, made only while at least
// three times as much again is free. A disk (nearly) full leaves the agent
// without one (the error says so); the agent runs all the same.
func (db *AgentStore) ReserveAnswers() error {
	path := db.answerReservePath()
	if fi, err := os.Stat(path); err == nil && fi.Size() >= answerReserveSize {
		return nil
	}
	// A reserve must never be what fills the disk.
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Dir(path), &st); err != nil {
		return fmt.Errorf("storage: answer reserve: %w", err)
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < 4*answerReserveSize {
		return fmt.Errorf("storage: answer reserve: %d bytes free: %w", free, syscall.ENOSPC)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("storage: answer reserve: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, answerReserveSize), 0); err != nil {
		os.Remove(path) // a partial reserve would promise room it lacks
		return fmt.Errorf("storage: answer reserve: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("storage: answer reserve: %w", err)
	}
	return nil
}

// SpillAnswers writes the updates caps (the handler's answers, in the
// order recorded) into the answer reserve and syncs it, for the next
// start to record. It returns how many it wrote: those that fit, in
// order. It overwrites what the reserve held: call it once, at the stop,
// after RecoverAnswers has emptied it at the start.
func (db *AgentStore) SpillAnswers(caps []*Capture) (int, error) {
	f, err := os.OpenFile(db.answerReservePath(), os.O_WRONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("storage: answer reserve: %w", err)
	}
	defer f.Close()
	var buf []byte
	n := 0
	for _, c := range caps {
		next, _ := intake.AppendFrame(buf, func(b []byte) []byte { return encodeUpdate(b, c) })
		if len(next)+8 > answerReserveSize { // and room for the zero frame that ends them
			break
		}
		buf, n = next, n+1
	}
	buf = append(buf, make([]byte, 8)...)
	if _, err := f.WriteAt(buf, 0); err != nil {
		return 0, fmt.Errorf("storage: answer reserve: %w", err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("storage: answer reserve: %w", err)
	}
	return n, nil
}

// RecoverAnswers records the answers an earlier run wrote into the answer
// reserve (SpillAnswers), then empties it. It returns how many it
// recorded. Should the records fail (a disk still full), they stay for
// the next start.
func (db *AgentStore) RecoverAnswers(ctx context.Context) (int, error) {
	path := db.answerReservePath()
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("storage: answer reserve: %w", err)
	}
	recs := reservedAnswers(data)
	if len(recs) == 0 {
		return 0, nil
	}
	if err := db.caughtUp(ctx); err != nil {
		return 0, err
	}
	updates := make([]*Capture, 0, len(recs))
	for _, r := range recs {
		kind, c, _, err := decodeRecord(r)
		if err != nil || kind != recUpdate {
			return 0, fmt.Errorf("storage: answer reserve %s: a record that is not an answer", path)
		}
		// One deleted since (calltap delete) has nothing to record.
		var one int
		switch err := db.read.QueryRowContext(ctx, `SELECT 1 FROM captures WHERE id = ?`, c.ID).Scan(&one); {
		case errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			return 0, err
		}
		updates = append(updates, c)
	}
	if _, err := db.WriteCaptures(ctx, nil, updates); err != nil {
		return 0, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("storage: answer reserve: %w", err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 8), 0); err != nil {
		return 0, fmt.Errorf("storage: answer reserve: %w", err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("storage: answer reserve: %w", err)
	}
	return len(updates), nil
}

// reservedAnswers are the payloads of the frames at the start of data, up
// to the zero frame that ends them (or a frame that does not hold: a stop
// cut short while writing them).
func reservedAnswers(data []byte) [][]byte {
	var recs [][]byte
	for off := 0; len(data)-off >= 8; {
		n := int(binary.LittleEndian.Uint32(data[off:]))
		sum := binary.LittleEndian.Uint32(data[off+4:])
		if n == 0 || n > len(data)-off-8 {
			break
		}
		payload := data[off+8 : off+8+n]
		if intake.Checksum(payload) != sum {
			break
		}
		recs = append(recs, payload)
		off += 8 + n
	}
	return recs
}
