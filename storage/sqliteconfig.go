package storage

// SQLite keeps memory statistics by default, and updating them takes a
// mutex shared by every connection of the process on every allocation.
// The agent runs its capture writer and its search indexer side by side,
// on two connections, and with the statistics on they take turns on that
// mutex (the README's Performance section has the cost). Nothing here
// reads the statistics. The option has to be set before SQLite initialises, which
// it does on the first connection: open turns it off, once, before its
// first connection.
//
// sqlite3_config is variadic, which cgo cannot call: the wrapper does.

// extern int sqlite3_config(int, ...);
// enum { calltapConfigMemstatus = 9 }; // SQLITE_CONFIG_MEMSTATUS in sqlite3.h
// static int calltap_memstatus_off(void) { return sqlite3_config(calltapConfigMemstatus, 0); }
import "C"

import "sync"

var (
	memstatusOnce sync.Once
	memstatusOff  int // SQLite's answer, set by disableMemstatus
)

// disableMemstatus turns SQLite's memory statistics off. SQLite answers
// SQLITE_MISUSE had it been initialised already (another package opened a
// connection first): the statistics then stay on and nothing else changes.
func disableMemstatus() { memstatusOff = int(C.calltap_memstatus_off()) }
