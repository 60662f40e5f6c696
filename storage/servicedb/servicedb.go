// Package servicedb is the emulated voice service's SQLite database
// (calltap mock-service): contacts, calls, webhook deliveries and their
// attempts. Delivery policy (what is retried, and when) belongs to package
// emulator; these queries only keep its state. The schema is its
// migrations folder, embedded; the core (opening, migrations) is package
// storage's.
package servicedb

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/calltap/calltap/storage"
)

// Schema names the emulated service's database.
const Schema storage.Schema = "service"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Store is the voice service emulator's database.
type Store struct{ *storage.DB }

// Open opens (creating if needed) the emulator's database at path.
func Open(ctx context.Context, path string, opts ...storage.Option) (*Store, error) {
	migrations, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	db, err := storage.Open(ctx, path, Schema, migrations, opts...)
	if err != nil {
		return nil, err
	}
	return &Store{db}, nil
}

// ErrNotFound is returned when a looked-up row does not exist.
var ErrNotFound = storage.ErrNotFound

// Page is the paging request every collection query takes (storage.Page).
type Page = storage.Page

// Contact is one contact of the emulated organisation.
type Contact struct {
	Seq          int64
	ID           string
	Name         string
	Phone        string
	Email        string
	CustomFields string // JSON object
	CreatedAt    time.Time
}

// Call is a call the emulator placed.
type Call struct {
	ID           string
	Scenario     string
	FromNumber   string
	ToNumber     string
	ContactID    string
	ContactName  string
	AgentName    string
	WebhookURL   string
	DispatchedAt time.Time
	RecordingAt  time.Time // zero: the call has no recording
}

// Delivery is one webhook delivery: one event of one call to one URL.
type Delivery struct {
	Seq            int64
	ID             string
	CallID         string
	Event          string
	URL            string
	Headers        string // JSON [[name, value], ...]
	Payload        []byte
	Status         string
	Attempts       int // in the current round
	MaxAttempts    int
	Round          int
	NextAt         time.Time // zero: no attempt due
	ResponseStatus int       // 0: no response
	ResponseBody   []byte
	Error          string
	CreatedAt      time.Time
	DeliveredAt    time.Time
}

// Attempt is one try at a delivery.
type Attempt struct {
	N              int // over the delivery's life; set by FinishAttempt
	Round          int
	Try            int // within the round
	At             time.Time
	ResponseStatus int // 0: no response
	ResponseBody   []byte
	Error          string
	Duration       time.Duration
}

// --- settings -----------------------------------------------------------

// InitServiceSetting stores value under key unless a value is there
// already, and returns the value kept.
func (db *Store) InitServiceSetting(ctx context.Context, key, value string) (string, error) {
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO service_settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`, key, value); err != nil {
		return "", err
	}
	var v string
	if err := tx.QueryRowContext(ctx, `SELECT value FROM service_settings WHERE key = ?`, key).Scan(&v); err != nil {
		return "", err
	}
	return v, tx.Commit()
}

// --- contacts -----------------------------------------------------------

// ContactFilter narrows a contact search to rows whose field equals one of
// Values (case-insensitively). Custom selects the organisation's custom
// fields instead of the contact's own.
type ContactFilter struct {
	Field  string
	Custom bool
	Values []string
}

// ContactColumns are the contact fields a search filter can name: a fresh
// list each call, so that no caller changes what the store accepts.
func ContactColumns() []string { return []string{"id", "name", "phone", "email"} }

// IsContactColumn reports whether name is one of ContactColumns.
func IsContactColumn(name string) bool {
	for _, c := range ContactColumns() {
		if c == name {
			return true
		}
	}
	return false
}

func upsertContact(ctx context.Context, tx *sql.Tx, c *Contact) error {
	if c.CustomFields == "" {
		c.CustomFields = "{}"
	}
	_, err := tx.ExecContext(ctx, `
		INSERT INTO contacts (id, name, phone, email, custom_fields, created_at) VALUES (?, ?, ?, ?, json(?), ?)
		ON CONFLICT (id) DO UPDATE SET
			name = CASE WHEN excluded.name <> '' THEN excluded.name ELSE name END,
			phone = CASE WHEN excluded.phone <> '' THEN excluded.phone ELSE phone END,
			email = CASE WHEN excluded.email <> '' THEN excluded.email ELSE email END,
			custom_fields = json_patch(custom_fields, excluded.custom_fields)`,
		c.ID, c.Name, c.Phone, c.Email, c.CustomFields, c.CreatedAt.UnixMicro())
	if err != nil {
		return fmt.Errorf("storage: save contact: %w", err)
	}
	row := tx.QueryRowContext(ctx, `SELECT seq, id, name, phone, email, custom_fields, created_at FROM contacts WHERE id = ?`, c.ID)
	got, err := scanContact(row)
	if err != nil {
		return err
	}
	*c = *got
	return nil
}

// ContactByID returns a contact, or ErrNotFound.
func (db *Store) ContactByID(ctx context.Context, id string) (*Contact, error) {
	row := db.Reader().QueryRowContext(ctx, `SELECT seq, id, name, phone, email, custom_fields, created_at FROM contacts WHERE id = ?`, id)
	c, err := scanContact(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return c, err
}

// ContactByPhone returns the oldest contact with phone, or ErrNotFound.
func (db *Store) ContactByPhone(ctx context.Context, phone string) (*Contact, error) {
	row := db.Reader().QueryRowContext(ctx, `SELECT seq, id, name, phone, email, custom_fields, created_at FROM contacts WHERE phone = ? ORDER BY seq LIMIT 1`, phone)
	c, err := scanContact(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return c, err
}

// CustomFieldInUse reports whether any contact has the custom field name.
func (db *Store) CustomFieldInUse(ctx context.Context, name string) (bool, error) {
	var n int
	err := db.Reader().QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM contacts, json_each(contacts.custom_fields) WHERE json_each.key = ?)`, name).Scan(&n)
	return n == 1, err
}

// ListContacts returns a page of contacts matching every filter, newest
// first, and the number of matching rows ignoring the page.
func (db *Store) ListContacts(ctx context.Context, filters []ContactFilter, p Page) ([]*Contact, int, error) {
	var where []string
	var args []any
	for _, f := range filters {
		if len(f.Values) == 0 {
			continue
		}
		var expr string
		if f.Custom {
			expr = `CAST(json_extract(custom_fields, ?) AS TEXT)`
			args = append(args, `$."`+strings.ReplaceAll(f.Field, `"`, ``)+`"`)
		} else {
			if !IsContactColumn(f.Field) {
				return nil, 0, fmt.Errorf("storage: %q is not a contact field", f.Field)
			}
			expr = f.Field
		}
		marks := strings.TrimSuffix(strings.Repeat("?, ", len(f.Values)), ", ")
		where = append(where, expr+` COLLATE NOCASE IN (`+marks+`)`)
		for _, v := range f.Values {
			args = append(args, v)
		}
	}
	cond := ""
	if len(where) > 0 {
		cond = " WHERE " + strings.Join(where, " AND ")
	}
	var count int
	if err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM contacts`+cond, args...).Scan(&count); err != nil {
		return nil, 0, err
	}
	rows, err := db.Reader().QueryContext(ctx, `SELECT seq, id, name, phone, email, custom_fields, created_at FROM contacts`+cond+
		` ORDER BY seq DESC LIMIT ? OFFSET ?`, append(args, p.Limit, p.Offset)...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []*Contact
	for rows.Next() {
		c, err := scanContact(rows)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, c)
	}
	return out, count, rows.Err()
}

// CountContacts is the number of contacts.
func (db *Store) CountContacts(ctx context.Context) (int, error) {
	var n int
	err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM contacts`).Scan(&n)
	return n, err
}

type scanner interface{ Scan(...any) error }

func scanContact(s scanner) (*Contact, error) {
	var c Contact
	var created int64
	if err := s.Scan(&c.Seq, &c.ID, &c.Name, &c.Phone, &c.Email, &c.CustomFields, &created); err != nil {
		return nil, err
	}
	c.CreatedAt = time.UnixMicro(created).UTC()
	return &c, nil
}

// --- calls --------------------------------------------------------------

// CreateCall saves a call, its contact (upserted, when given) and the
// deliveries of its events in one transaction.
func (db *Store) CreateCall(ctx context.Context, call *Call, contact *Contact, deliveries []*Delivery, attempts map[string][]*Attempt) error {
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := createCall(ctx, tx, call, contact, deliveries, attempts); err != nil {
		return err
	}
	return tx.Commit()
}

// SeedService saves many contacts and calls in one transaction (--seed).
// calls[i] goes with deliveries[i]; attempts are keyed by delivery id.
func (db *Store) SeedService(ctx context.Context, contacts []*Contact, calls []*Call, deliveries [][]*Delivery, attempts map[string][]*Attempt) error {
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, c := range contacts {
		if err := upsertContact(ctx, tx, c); err != nil {
			return err
		}
	}
	for i, call := range calls {
		if err := createCall(ctx, tx, call, nil, deliveries[i], attempts); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func createCall(ctx context.Context, tx *sql.Tx, call *Call, contact *Contact, deliveries []*Delivery, attempts map[string][]*Attempt) error {
	if contact != nil {
		if err := upsertContact(ctx, tx, contact); err != nil {
			return err
		}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO calls (id, scenario, from_number, to_number, contact_id, contact_name, agent_name, webhook_url, dispatched_at, recording_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		call.ID, call.Scenario, call.FromNumber, call.ToNumber, call.ContactID, call.ContactName, call.AgentName, call.WebhookURL,
		call.DispatchedAt.UnixMicro(), storage.Micros(call.RecordingAt))
	if err != nil {
		return fmt.Errorf("storage: save call: %w", err)
	}
	for _, d := range deliveries {
		res, err := tx.ExecContext(ctx, `INSERT INTO deliveries (id, call_id, event, url, headers, payload, status, attempts, max_attempts, round, next_at,
			response_status, response_body, error, created_at, delivered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			d.ID, d.CallID, d.Event, d.URL, d.Headers, d.Payload, d.Status, d.Attempts, d.MaxAttempts, d.Round, storage.Micros(d.NextAt),
			nullInt(d.ResponseStatus), d.ResponseBody, d.Error, d.CreatedAt.UnixMicro(), storage.Micros(d.DeliveredAt))
		if err != nil {
			return fmt.Errorf("storage: save delivery: %w", err)
		}
		d.Seq, _ = res.LastInsertId()
		for i, a := range attempts[d.ID] {
			a.N = i + 1
			if err := insertServiceAttempt(ctx, tx, d.ID, a); err != nil {
				return err
			}
		}
	}
	return nil
}

// CallByID returns a call, or ErrNotFound.
func (db *Store) CallByID(ctx context.Context, id string) (*Call, error) {
	var c Call
	var dispatched int64
	var rec sql.NullInt64
	err := db.Reader().QueryRowContext(ctx, `SELECT id, scenario, from_number, to_number, contact_id, contact_name, agent_name, webhook_url, dispatched_at, recording_at
		FROM calls WHERE id = ?`, id).Scan(&c.ID, &c.Scenario, &c.FromNumber, &c.ToNumber, &c.ContactID, &c.ContactName, &c.AgentName, &c.WebhookURL, &dispatched, &rec)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	} else if err != nil {
		return nil, err
	}
	c.DispatchedAt = time.UnixMicro(dispatched).UTC()
	c.RecordingAt = storage.FromMicros(rec)
	return &c, nil
}

// --- deliveries ---------------------------------------------------------

// DeliveryFilter narrows the delivery log. Zero fields do not filter.
type DeliveryFilter struct {
	CallID string
	Event  string
	Status string
}

const deliveryColumns = `seq, id, call_id, event, url, headers, payload, status, attempts, max_attempts, round, next_at,
	response_status, response_body, error, created_at, delivered_at`

func scanDelivery(s scanner) (*Delivery, error) {
	var d Delivery
	var next, delivered sql.NullInt64
	var rs sql.NullInt64
	var created int64
	if err := s.Scan(&d.Seq, &d.ID, &d.CallID, &d.Event, &d.URL, &d.Headers, &d.Payload, &d.Status, &d.Attempts, &d.MaxAttempts, &d.Round, &next,
		&rs, &d.ResponseBody, &d.Error, &created, &delivered); err != nil {
		return nil, err
	}
	d.NextAt = storage.FromMicros(next)
	d.ResponseStatus = int(rs.Int64)
	d.CreatedAt = time.UnixMicro(created).UTC()
	d.DeliveredAt = storage.FromMicros(delivered)
	return &d, nil
}

// ListDeliveries returns a page of the delivery log as of now (rows due
// later are not there yet), newest first, and the number of rows matching.
func (db *Store) ListDeliveries(ctx context.Context, f DeliveryFilter, now time.Time, p Page) ([]*Delivery, int, error) {
	cond := ` WHERE created_at <= ?`
	args := []any{now.UnixMicro()}
	if f.CallID != "" {
		cond += ` AND call_id = ?`
		args = append(args, f.CallID)
	}
	if f.Event != "" {
		cond += ` AND event = ?`
		args = append(args, f.Event)
	}
	if f.Status != "" {
		cond += ` AND status = ?`
		args = append(args, f.Status)
	}
	var count int
	if err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM deliveries`+cond, args...).Scan(&count); err != nil {
		return nil, 0, err
	}
	rows, err := db.Reader().QueryContext(ctx, `SELECT `+deliveryColumns+` FROM deliveries`+cond+` ORDER BY created_at DESC, seq DESC LIMIT ? OFFSET ?`,
		append(args, p.Limit, p.Offset)...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []*Delivery
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, d)
	}
	return out, count, rows.Err()
}

// DeliveryByID returns a delivery that exists as of now with all its
// attempts, or ErrNotFound. The two are read apart: an attempt finishing in
// between shows in the log one step ahead of the row.
func (db *Store) DeliveryByID(ctx context.Context, id string, now time.Time) (*Delivery, []*Attempt, error) {
	d, err := scanDelivery(db.Reader().QueryRowContext(ctx, `SELECT `+deliveryColumns+` FROM deliveries WHERE id = ? AND created_at <= ?`, id, now.UnixMicro()))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, ErrNotFound
	} else if err != nil {
		return nil, nil, err
	}
	rows, err := db.Reader().QueryContext(ctx, `SELECT n, round, try, at, response_status, response_body, error, duration_us FROM delivery_attempts WHERE delivery_id = ? ORDER BY n`, id)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var out []*Attempt
	for rows.Next() {
		var a Attempt
		var at, dur int64
		var rs sql.NullInt64
		if err := rows.Scan(&a.N, &a.Round, &a.Try, &at, &rs, &a.ResponseBody, &a.Error, &dur); err != nil {
			return nil, nil, err
		}
		a.At = time.UnixMicro(at).UTC()
		a.ResponseStatus = int(rs.Int64)
		a.Duration = time.Duration(dur) * time.Microsecond
		out = append(out, &a)
	}
	return d, out, rows.Err()
}

// ReplayDelivery gives a delivery that exists as of now a fresh budget of
// attempts, the first due at now, and returns it.
func (db *Store) ReplayDelivery(ctx context.Context, id string, now time.Time) (*Delivery, error) {
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE deliveries SET status = 'pending', attempts = 0, round = round + 1, next_at = ?
		WHERE id = ? AND created_at <= ?`, now.UnixMicro(), id, now.UnixMicro())
	if err != nil {
		return nil, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, ErrNotFound
	}
	d, err := scanDelivery(tx.QueryRowContext(ctx, `SELECT `+deliveryColumns+` FROM deliveries WHERE id = ?`, id))
	if err != nil {
		return nil, err
	}
	return d, tx.Commit()
}

// ResetInflight releases every delivery marked in flight: at start-up none
// is, whatever a crash left behind. Their next_at is kept, so they are due.
func (db *Store) ResetInflight(ctx context.Context) error {
	_, err := db.Writer().ExecContext(ctx, `UPDATE deliveries SET inflight = 0, next_at = coalesce(next_at, created_at) WHERE inflight = 1 AND status = 'pending'`)
	if err == nil {
		_, err = db.Writer().ExecContext(ctx, `UPDATE deliveries SET inflight = 0 WHERE inflight = 1`)
	}
	return err
}

// ClaimDueDeliveries marks as in flight and returns up to limit pending
// deliveries due by now, at most one per call and none of a call that has an
// attempt in flight already, earliest due first: a call's events are tried
// one at a time, in the order they are due.
func (db *Store) ClaimDueDeliveries(ctx context.Context, now time.Time, limit int) ([]*Delivery, error) {
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT `+deliveryColumns+` FROM deliveries
		WHERE status = 'pending' AND inflight = 0 AND next_at <= ?
		  AND call_id NOT IN (SELECT call_id FROM deliveries WHERE inflight = 1)
		ORDER BY next_at, seq LIMIT ?`, now.UnixMicro(), limit*4)
	if err != nil {
		return nil, err
	}
	var out []*Delivery
	seen := map[string]bool{}
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		if seen[d.CallID] || len(out) >= limit {
			continue
		}
		seen[d.CallID] = true
		out = append(out, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, d := range out {
		if _, err := tx.ExecContext(ctx, `UPDATE deliveries SET inflight = 1 WHERE id = ?`, d.ID); err != nil {
			return nil, err
		}
	}
	return out, tx.Commit()
}

// NextDeliveryDue is the earliest next_at of a pending delivery that could
// be claimed (not in flight, nor of a call in flight); ok is false when
// there is none.
func (db *Store) NextDeliveryDue(ctx context.Context) (at time.Time, ok bool, err error) {
	var n sql.NullInt64
	err = db.Writer().QueryRowContext(ctx, `SELECT min(next_at) FROM deliveries
		WHERE status = 'pending' AND inflight = 0 AND next_at IS NOT NULL
		  AND call_id NOT IN (SELECT call_id FROM deliveries WHERE inflight = 1)`).Scan(&n)
	if err != nil || !n.Valid {
		return time.Time{}, false, err
	}
	return storage.FromMicros(n), true, nil
}

// ReleaseDelivery takes a delivery out of flight without recording an
// attempt (the emulator stopped mid-attempt); it stays due.
func (db *Store) ReleaseDelivery(ctx context.Context, id string) error {
	_, err := db.Writer().ExecContext(ctx, `UPDATE deliveries SET inflight = 0 WHERE id = ?`, id)
	return err
}

// AttemptOutcome is what an attempt leaves a delivery in.
type AttemptOutcome struct {
	Status      string    // pending | delivered | failed
	NextAt      time.Time // the next attempt; zero when none
	DeliveredAt time.Time
}

// FinishAttempt records attempt a of delivery id, made in round, and takes
// the delivery out of flight. When a replay started a new round meanwhile,
// the attempt is logged but the delivery keeps the new round's state.
func (db *Store) FinishAttempt(ctx context.Context, id string, round int, a *Attempt, o AttemptOutcome) error {
	tx, err := db.Writer().BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(max(n), 0) + 1 FROM delivery_attempts WHERE delivery_id = ?`, id).Scan(&a.N); err != nil {
		return err
	}
	a.Round = round
	if err := insertServiceAttempt(ctx, tx, id, a); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE deliveries SET inflight = 0 WHERE id = ?`, id); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `UPDATE deliveries SET attempts = attempts + 1, status = ?, next_at = ?, response_status = ?, response_body = ?, error = ?,
		delivered_at = coalesce(?, delivered_at) WHERE id = ? AND round = ?`,
		o.Status, storage.Micros(o.NextAt), nullInt(a.ResponseStatus), a.ResponseBody, a.Error, storage.Micros(o.DeliveredAt), id, round)
	if err != nil {
		return err
	}
	return tx.Commit()
}

func insertServiceAttempt(ctx context.Context, tx *sql.Tx, id string, a *Attempt) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO delivery_attempts (delivery_id, n, round, try, at, response_status, response_body, error, duration_us)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		id, a.N, a.Round, a.Try, a.At.UnixMicro(), nullInt(a.ResponseStatus), a.ResponseBody, a.Error, a.Duration.Microseconds())
	if err != nil {
		return fmt.Errorf("storage: save attempt: %w", err)
	}
	return nil
}

// nullInt maps 0 to NULL.
func nullInt(n int) sql.NullInt64 { return sql.NullInt64{Int64: int64(n), Valid: n != 0} }
