// Package historytest writes chaos-run history files for tests: a whole
// file of records at once, as a run would have left it.
package historytest

import "github.com/calltap/calltap/scripts/chaos/history"

// WriteAll writes recs to dir/name in one go, replacing the file.
func WriteAll[T any](dir, name string, recs []T) error {
	l, err := history.Create[T](dir, name)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := l.Append(r); err != nil {
			l.Close()
			return err
		}
	}
	return l.Close()
}
