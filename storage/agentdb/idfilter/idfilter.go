// Package idfilter is the Bloom filter of an agent store's delivery ids
// that keeps the intake log's duplicate check off SQLite for new ids
// (storage/agentdb's intake log owns one).
package idfilter

import "hash/maphash"

// Filter is a Bloom filter of the delivery ids in an agent store, so
// that the intake log's duplicate check (lookupDelivery) answers "never
// seen" for a new id without a SQLite read on the answer path: a read
// there costs a read transaction's locks and page reads, a third of the
// agent's system calls per request. A "maybe" is checked in SQLite, so a
// false positive (about 1 in 500 at 10⁶ ids) costs only that read. Ids of
// deleted captures stay in: a "maybe" the store answers "no".
type Filter struct {
	bits []uint64
}

const (
	filterBits   = 1 << 24 // 2 MiB
	filterHashes = 4
)

var filterSeed = maphash.MakeSeed()

// New is an empty filter: 2 MiB of bits.
func New() *Filter { return &Filter{bits: make([]uint64, filterBits/64)} }

// positions calls fn with the bit positions of s (double hashing).
func (f *Filter) positions(s string, fn func(n uint64)) {
	h := maphash.String(filterSeed, s)
	step := h>>33 | 1
	for i := range uint64(filterHashes) {
		fn((h + i*step) % filterBits)
	}
}

// Add adds the id s.
func (f *Filter) Add(s string) {
	f.positions(s, func(n uint64) { f.bits[n/64] |= 1 << (n % 64) })
}

// MayHave is false only for an id never added.
func (f *Filter) MayHave(s string) bool {
	all := true
	f.positions(s, func(n uint64) { all = all && f.bits[n/64]&(1<<(n%64)) != 0 })
	return all
}
