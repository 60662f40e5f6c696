package storage

// SQLite keeps memory statistics by default, and updating them takes a
// mutex shared by every connection of the process on every allocation.
// The agent runs its capture writer and its search indexer side by side,
// on two connections; with the statistics on, they took turns on that
// mutex and together saved and indexed 19,000 captures/s, with them off
// 23,000/s (the store benchmark's sustained measure, on 2 cores). Nothing here reads the
// statistics. The option has to be set before SQLite initialises, which
// it does on the first connection; a package variable of the only package
// that imports the driver is set before any code can open one.
//
// sqlite3_config is variadic, which cgo cannot call: the wrapper does.

// extern int sqlite3_config(int, ...);
// enum { calltapConfigMemstatus = 9 }; // SQLITE_CONFIG_MEMSTATUS in sqlite3.h
// static int calltap_memstatus_off(void) { return sqlite3_config(calltapConfigMemstatus, 0); }
import "C"

// memstatusOff is SQLite's answer: SQLITE_OK (0), or SQLITE_MISUSE (21)
// had SQLite been initialised already, in which case the statistics stay
// on and nothing else changes.
var memstatusOff = int(C.calltap_memstatus_off())
