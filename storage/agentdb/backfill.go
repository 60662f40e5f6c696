package agentdb

import (
	"context"
	"strings"
)

// KnownDeliveryIDs reports which of ids (the payloads' delivery ids) some
// capture already holds, so a backfill imports only what never arrived.
func (db *AgentStore) KnownDeliveryIDs(ctx context.Context, ids []string) (_ map[string]bool, err error) {
	defer db.explain(&err)
	if err := db.caughtUp(ctx); err != nil {
		return nil, err
	}
	known := make(map[string]bool)
	// SQLite bounds the number of parameters of a statement; stay well
	// under it.
	const chunk = 500
	for len(ids) > 0 {
		n := min(len(ids), chunk)
		part := ids[:n]
		ids = ids[n:]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		rows, err := db.read.QueryContext(ctx, `SELECT DISTINCT delivery_id FROM captures WHERE delivery_id IN (?`+
			strings.Repeat(",?", len(part)-1)+`)`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, err
			}
			known[id] = true
		}
		err = rows.Close()
		if err == nil {
			err = rows.Err()
		}
		if err != nil {
			return nil, err
		}
	}
	return known, nil
}
