package agentdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"

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
// The file (answers.reserve, among the body files) is a reserve file of
// storage/intake's, holding the intake log's update records.

func (db *AgentStore) answerReservePath() string {
	return filepath.Join(BodiesDir(db.path), "answers.reserve")
}

// ReserveAnswers makes the answer reserve, unless it is there already
// (intake.MakeReserve). A disk (nearly) full leaves the agent without one
// (the error says so); the agent runs all the same.
func (db *AgentStore) ReserveAnswers() error {
	if err := intake.MakeReserve(db.answerReservePath()); err != nil {
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
	n, err := intake.FillReserve(db.answerReservePath(), len(caps), func(i int, b []byte) []byte {
		return encodeUpdate(b, caps[i])
	})
	if err != nil {
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
	recs, err := intake.ReadReserve(path)
	if err != nil {
		return 0, fmt.Errorf("storage: answer reserve: %w", err)
	}
	if len(recs) == 0 {
		return 0, nil
	}
	if err := db.caughtUp(ctx); err != nil {
		return 0, err
	}
	updates, err := db.reservedUpdates(ctx, path, recs)
	if err != nil {
		return 0, err
	}
	if _, err := db.WriteCaptures(ctx, nil, updates); err != nil {
		return 0, err
	}
	if err := intake.EmptyReserve(path); err != nil {
		return 0, fmt.Errorf("storage: answer reserve: %w", err)
	}
	return len(updates), nil
}

// reservedUpdates decodes the reserve's records, the answers of captures
// still in the store: one deleted since (calltap delete) has nothing to
// record.
func (db *AgentStore) reservedUpdates(ctx context.Context, path string, recs [][]byte) ([]*Capture, error) {
	updates := make([]*Capture, 0, len(recs))
	for _, r := range recs {
		kind, c, _, err := decodeRecord(r)
		if err != nil || kind != recUpdate {
			return nil, fmt.Errorf("storage: answer reserve %s: a record that is not an answer", path)
		}
		var one int
		switch err := db.read.QueryRowContext(ctx, `SELECT 1 FROM captures WHERE id = ?`, c.ID).Scan(&one); {
		case errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			return nil, err
		}
		updates = append(updates, c)
	}
	return updates, nil
}
