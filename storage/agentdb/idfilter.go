package agentdb

import (
	"context"
	"hash/maphash"
)

// idFilter is a Bloom filter of the delivery ids in an agent store, so
// that the intake log's duplicate check (lookupDelivery) answers "never
// seen" for a new id without a SQLite read on the answer path: a read
// there costs a read transaction's locks and page reads, a third of the
// agent's system calls per request. A "maybe" is checked in SQLite, so a
// false positive (about 1 in 500 at 10⁶ ids) costs only that read. Ids of
// deleted captures stay in: a "maybe" the store answers "no".
type idFilter struct {
	bits []uint64
}

const (
	idFilterBits   = 1 << 24 // 2 MiB
	idFilterHashes = 4
)

var idFilterSeed = maphash.MakeSeed()

func newIDFilter() *idFilter { return &idFilter{bits: make([]uint64, idFilterBits/64)} }

// positions calls fn with the bit positions of s (double hashing).
func (f *idFilter) positions(s string, fn func(n uint64)) {
	h := maphash.String(idFilterSeed, s)
	step := h>>33 | 1
	for i := range uint64(idFilterHashes) {
		fn((h + i*step) % idFilterBits)
	}
}

func (f *idFilter) add(s string) {
	f.positions(s, func(n uint64) { f.bits[n/64] |= 1 << (n % 64) })
}

// mayHave is false only for an id never added.
func (f *idFilter) mayHave(s string) bool {
	all := true
	f.positions(s, func(n uint64) { all = all && f.bits[n/64]&(1<<(n%64)) != 0 })
	return all
}

// buildIDFilter fills a filter with the store's delivery ids, off the
// answer path, and hands it to LogCaptures. Until then every check reads
// SQLite. The ids saved while it reads are added under mu, which
// LogCaptures holds: those committed since the big read, and those still
// pending (a record leaves pending only once committed).
func (in *intakeLog) buildIDFilter() {
	defer close(in.filterDone)
	ctx := context.Background()
	f := newIDFilter()
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
		f.add(d)
	}
	in.ids = f
}

func (in *intakeLog) addDeliveryIDs(ctx context.Context, f *idFilter, cond string, upto int64) error {
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
		f.add(d)
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
			in.ids.add(c.DeliveryID)
		}
	}
}
