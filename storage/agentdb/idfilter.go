package agentdb

import (
	"context"
	"database/sql"
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

// addStored adds the delivery ids of the captures in read that cond (on
// seq, with upto) picks.
func (f *idFilter) addStored(ctx context.Context, read *sql.DB, cond string, upto int64) error {
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
		f.add(d)
	}
	return rows.Err()
}
