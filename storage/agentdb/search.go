package agentdb

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Captures lists captures newest first, without bodies, and counts all that
// match the filter.
func (db *AgentStore) Captures(ctx context.Context, f CaptureFilter) (_ []*Capture, _ int, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, 0, err
	}
	if q := ftsQuery(f.Text); q != "" {
		if err := db.CatchUpSearch(ctx); err != nil {
			return nil, 0, err
		}
		return db.searchCaptures(ctx, f, q)
	}
	return db.listCaptures(ctx, f)
}

// Text search over 10⁶ captures. Counting the matches through captures
// (seq IN (SELECT docid ...)) looks up a captures row per match: at a term
// in a fifth of the bodies that is 200,000 lookups. The full-text index
// alone knows both the count and the newest matches (docid = seq), so:
//
//   - one pass over the index, capped at searchCap, gives every match of
//     a rare query (a lead id, a call id). It reads oldest first: FTS4
//     then reads the doclists incrementally, which stops early for a
//     common term and, for a phrase with a common token ("L-123" is
//     "l" "123"), walks the common token's doclist without loading it
//     whole (measured at 10⁶: 7–10 ms against 15–18 ms newest first);
//   - a query with more matches and no other filter is counted on the
//     index and paged on it;
//   - a query with more matches and other filters goes through captures,
//     as before.

// searchCap is how many matches the first pass collects.
const searchCap = 1000

func (db *AgentStore) searchCaptures(ctx context.Context, f CaptureFilter, q string) ([]*Capture, int, error) {
	seqs, err := db.ftsSeqs(ctx, q, "ASC", searchCap+1, 0)
	if err != nil {
		return nil, 0, err
	}
	conds, args := f.conds()
	switch {
	case len(seqs) <= searchCap:
		// Every match is in hand; newest first.
		slices.Reverse(seqs)
		if len(conds) == 0 {
			return db.capturesBySeq(ctx, page(seqs, f.Page), len(seqs))
		}
		list, err := json.Marshal(seqs)
		if err != nil {
			return nil, 0, err
		}
		conds = append(conds, "seq IN (SELECT value FROM json_each(?))")
		args = append(args, string(list))
		return db.listWhere(ctx, joinWhere(conds), args, f.Page)
	case len(conds) == 0:
		count, err := db.index.File().Count(ctx, db.read, q)
		if err != nil {
			return nil, 0, err
		}
		if seqs, err = db.ftsSeqs(ctx, q, "DESC", f.Limit, f.Offset); err != nil {
			return nil, 0, err
		}
		return db.capturesBySeq(ctx, seqs, count)
	default:
		return db.listCaptures(ctx, f)
	}
}

// page is p's part of seqs.
func page(seqs []int64, p Page) []int64 {
	lo := min(max(p.Offset, 0), len(seqs))
	hi := min(lo+max(p.Limit, 0), len(seqs))
	return seqs[lo:hi]
}

// ftsSeqs returns the seqs of the captures whose body matches FTS query
// q, in order ("ASC" or "DESC").
func (db *AgentStore) ftsSeqs(ctx context.Context, q, order string, limit, offset int) ([]int64, error) {
	return db.index.File().Seqs(ctx, db.read, q, order, limit, offset)
}

// capturesBySeq loads the listed captures, newest first, without bodies.
func (db *AgentStore) capturesBySeq(ctx context.Context, seqs []int64, count int) ([]*Capture, int, error) {
	if len(seqs) == 0 {
		return []*Capture{}, count, nil
	}
	marks := strings.TrimSuffix(strings.Repeat("?,", len(seqs)), ",")
	args := make([]any, len(seqs))
	for i, s := range seqs {
		args[i] = s
	}
	rows, err := db.read.QueryContext(ctx, `SELECT `+captureColumns+` FROM captures WHERE seq IN (`+marks+`) ORDER BY seq DESC`, args...)
	if err != nil {
		return nil, 0, fmt.Errorf("storage: load search matches: %w", err)
	}
	out, err := scanCaptures(rows, len(seqs))
	return out, count, err
}
