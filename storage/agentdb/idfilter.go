package agentdb

import (
	"context"
	"database/sql"

	"github.com/calltap/calltap/storage/agentdb/idfilter"
)

// addStored adds to f the delivery ids of the captures in read that cond
// (on seq, with upto) picks.
func addStored(ctx context.Context, f *idfilter.Filter, read *sql.DB, cond string, upto int64) error {
	rows, err := read.QueryContext(ctx, `SELECT delivery_id FROM captures WHERE `+cond+` AND delivery_id IS NOT NULL`, upto)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return err
		}
		f.Add(d)
	}
	return rows.Err()
}
