package storage

import (
	"context"
	"database/sql"
	"fmt"
)

// IncrementalVacuum frees the free pages of schema, switching it to
// incremental auto_vacuum first if it is not (a file attached later, such
// as an agent's search index, is created without it; an empty or new one
// converts at once).
func IncrementalVacuum(ctx context.Context, conn *sql.Conn, schema string) error {
	var mode int
	if err := conn.QueryRowContext(ctx, `PRAGMA `+schema+`.auto_vacuum`).Scan(&mode); err != nil {
		return fmt.Errorf("storage: %s auto_vacuum: %w", schema, err)
	}
	if mode != 2 {
		if _, err := conn.ExecContext(ctx, `PRAGMA `+schema+`.auto_vacuum = INCREMENTAL`); err != nil {
			return fmt.Errorf("storage: %s auto_vacuum: %w", schema, err)
		}
		if _, err := conn.ExecContext(ctx, `VACUUM `+schema); err != nil {
			return fmt.Errorf("storage: vacuum %s: %w", schema, err)
		}
	}
	// PRAGMA incremental_vacuum returns a row per step: read them all so
	// that it runs to the end.
	rows, err := conn.QueryContext(ctx, `PRAGMA `+schema+`.incremental_vacuum`)
	if err != nil {
		return fmt.Errorf("storage: incremental vacuum of %s: %w", schema, err)
	}
	for rows.Next() {
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("storage: incremental vacuum of %s: %w", schema, err)
	}
	return nil
}
