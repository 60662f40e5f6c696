package agentdb

import (
	"context"

	"github.com/calltap/calltap/storage/agentdb/idfilter"
)

// buildIDFilter fills a filter with the store's delivery ids, off the
// answer path, and hands it to LogCaptures. Until then every check reads
// SQLite. The ids saved while it reads are added under mu, which
// LogCaptures holds: those committed since the big read, and those still
// pending (a record leaves pending only once committed).
func (in *intakeLog) buildIDFilter() {
	defer close(in.filterDone)
	ctx := context.Background()
	f := idfilter.New()
	var upto int64
	if err := in.db.read.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM captures`).Scan(&upto); err != nil {
		return // every check keeps reading SQLite
	}
	if err := in.addDeliveryIDs(ctx, f, `seq <= ?`, upto); err != nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return
	}
	if err := in.addDeliveryIDs(ctx, f, `seq > ?`, upto); err != nil {
		return
	}
	for d := range in.byDeliver {
		f.Add(d)
	}
	in.ids = f
}

func (in *intakeLog) addDeliveryIDs(ctx context.Context, f *idfilter.Filter, cond string, upto int64) error {
	rows, err := in.db.read.QueryContext(ctx, `SELECT delivery_id FROM captures WHERE `+cond+` AND delivery_id IS NOT NULL`, upto)
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

// noteSaved adds the delivery ids of captures written straight to SQLite
// (WriteCaptures: imports, replays of this process) to the filter.
func (in *intakeLog) noteSaved(cs []*Capture) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.ids == nil {
		return
	}
	for _, c := range cs {
		if c.DeliveryID != "" {
			in.ids.Add(c.DeliveryID)
		}
	}
}
