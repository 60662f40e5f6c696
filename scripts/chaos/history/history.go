// Package history is the record a chaos run leaves behind: what every sender
// sent and was told, what the handler received, which faults the nemesis
// injected and when, and what the agent's store held once the run drained.
// It is the contract between the chaos runner (scripts/chaos, which writes it)
// and the checker (scripts/chaos/check, which reads it and holds both the
// rules and the HTML report, as one package).
//
// A run writes one folder holding meta.json and four JSON Lines files
// (sends.jsonl, handler.jsonl, faults.jsonl, store.jsonl). The field names
// are exactly those of the format note the runner and the checker agreed on
// (Capture has one more, optional: error); all times are Unix nanoseconds
// from the chaos program's one clock.
//
// What the checker relies on, beyond the types:
//   - handler.jsonl is in the order the handler received the requests (the
//     order rule compares places in it): stamp received_at and append
//     under one lock.
//   - The handler's answer body names the delivery id and a counter of the
//     copy, so that each copy's body is unique; a sender's 2xx is matched
//     to the copy whose status and body it carries.
//   - A sender records the answer's body byte for byte (its first 4 KiB)
//     and its Retry-After header as sent; status 0 only for no answer.
//   - A fault's start is when the nemesis acted, its end when it healed
//     (0 if the run ended first).
//   - A capture the agent marked interrupted (failed, error "interrupted:
//     …") is written with State "interrupted", or "failed" with Error.
//   - With a route file (Meta.Routes), a handler server per route and one
//     for the default, each copy naming the route whose server got it; a
//     send names the developer its event's body carried, if any.
//   - With claimant agents (Meta.Claimants), each claimant's own handler
//     server and store: a copy names the claimant whose server got it, a
//     capture the claimant whose store held it (neither names one for the
//     token's default agent, the one with the route file).
package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// The files of a run's folder.
const (
	MetaFile    = "meta.json"
	SendsFile   = "sends.jsonl"
	HandlerFile = "handler.jsonl"
	FaultsFile  = "faults.jsonl"
	StoreFile   = "store.jsonl"
)

// The run's modes.
const (
	ModeTeam   = "team"
	ModeSingle = "single"
)

// The fault kinds the nemesis injects.
const (
	FaultSigkill  = "sigkill"
	FaultSigterm  = "sigterm"
	FaultSigstop  = "sigstop"
	FaultNetCut   = "net-cut"
	FaultNetSlow  = "net-slow"
	FaultNetDrop  = "net-drop"
	FaultDiskFull = "disk-full"
	FaultPowerCut = "power-cut"
)

// Meta describes the run as a whole.
type Meta struct {
	Seed    int64   `json:"seed"`
	Mode    string  `json:"mode"` // ModeTeam or ModeSingle
	Minutes float64 `json:"minutes"`
	Started int64   `json:"started"`
	Ended   int64   `json:"ended"`
	// Drained is when the store was read, after the senders stopped and
	// the agent had delivered what it held.
	Drained int64  `json:"drained"`
	Bounds  Bounds `json:"bounds"`
	// Routes are the agent's routes, in the route file's order; none for a
	// run without a route file (the checker's route rule then has nothing
	// to check).
	Routes []Route `json:"routes,omitempty"`
	// Claimants are the agents that share the token with the default one,
	// each claiming the calls of a developer; none for a run with one
	// agent (the checker's claim rules then have nothing to check).
	Claimants []Claimant `json:"claimants,omitempty"`
}

// Claimant is one agent that claims a developer's calls on the shared
// token (calltap listen --claim call.variables.developer=Developer).
type Claimant struct {
	// Name names the agent ("alice"): its process is "agent-<name>" in
	// faults, and copies and captures name it as their seat.
	Name      string `json:"name"`
	Developer string `json:"developer"`
}

// ClaimantProc is the process name of claimant name's agent, as fault
// targets name it; the default agent's is "agent".
func ClaimantProc(name string) string { return "agent-" + name }

// DefaultRoute is the name calltap gives a request no route took: it goes
// to --forward-to.
const DefaultRoute = "default"

// Route is one route of the agent's route file, as the runner wrote it: the
// checker works out from these, on its own, where each request belongs.
type Route struct {
	Name string `json:"name"`
	// Events are the event kinds the route takes, each a glob as
	// path.Match reads it; none means any kind.
	Events []string `json:"events,omitempty"`
	// Developer, when set, is the call.variables.developer the route
	// takes: the event's own, or, when its body has none, the one an
	// earlier event of its call carried (a call stays together).
	Developer string `json:"developer,omitempty"`
}

// Bounds are the availability limits the README states; the checker reports
// waits against them and never counts exceeding them as a safety violation.
type Bounds struct {
	// AnswerMaxMS is the longest a sender should wait for any answer.
	AnswerMaxMS int64 `json:"answer_max_ms"`
	// No2xxMaxMS is the longest window in which no sender gets a 2xx.
	No2xxMaxMS int64 `json:"no_2xx_max_ms"`
}

// Send is one HTTP attempt of a sender: a line of sends.jsonl.
type Send struct {
	Sender string `json:"sender"`
	Tunnel string `json:"tunnel"`
	CallID string `json:"call_id"`
	// Seq is the event's position in its call, from 0.
	Seq int `json:"seq"`
	// DeliveryID is the payload's id, the same on every retry.
	DeliveryID string `json:"delivery_id"`
	Event      string `json:"event"`
	// Developer is the call.variables.developer of the event's body; empty
	// when the body has none.
	Developer string `json:"developer,omitempty"`
	// Attempt counts the sends of this delivery, from 1.
	Attempt    int   `json:"attempt"`
	SentAt     int64 `json:"sent_at"`
	AnsweredAt int64 `json:"answered_at"` // 0 if no answer
	// Status is the answer's status; 0 means no answer (transport error or
	// timeout).
	Status     int    `json:"status"`
	Body       string `json:"body"` // the answer's body, first 4 KiB
	RetryAfter string `json:"retry_after"`
	Error      string `json:"error"`
}

// Copy is one request the handler received: a line of handler.jsonl, in the
// order the handler received them.
type Copy struct {
	ReceivedAt int64  `json:"received_at"`
	Tunnel     string `json:"tunnel"`
	DeliveryID string `json:"delivery_id"`
	CallID     string `json:"call_id"`
	Seq        int    `json:"seq"`
	// Route names the handler server that got the copy: a route of
	// Meta.Routes, or DefaultRoute; empty in a run without a route file.
	Route string `json:"route,omitempty"`
	// Seat names the claimant (Meta.Claimants) whose agent's server got
	// the copy; empty for the token's default agent.
	Seat       string `json:"seat,omitempty"`
	BodySHA256 string `json:"body_sha256"`
	// Status and AnswerBody are what the handler answered; the body names
	// the delivery id and a per-copy counter, so that a sender's 2xx body
	// can be matched to the copy it came from.
	Status     int    `json:"status"`
	AnswerBody string `json:"answer_body"`
}

// Fault is one fault the nemesis injected: a line of faults.jsonl.
type Fault struct {
	Start int64 `json:"start"`
	// End is when the fault was healed (the process continued or
	// restarted, the link restored, the disk given room); 0 if the run
	// ended first.
	End  int64  `json:"end"`
	Kind string `json:"kind"` // one of the Fault* constants
	// Target names what was hit: "agent", "relay-2", "nats-1",
	// "agent->relay-1", "relay-2->nats-2".
	Target string `json:"target"`
	Detail string `json:"detail"`
}

// Capture is one capture of an agent's store, read after the run drained:
// a line of store.jsonl.
type Capture struct {
	CaptureID  string `json:"capture_id"`
	Tunnel     string `json:"tunnel"`
	DeliveryID string `json:"delivery_id"`
	ReceivedAt int64  `json:"received_at"`
	// State is the store's word: delivered, failed, pending, queued,
	// interrupted, answer-unknown, … The checker reads "interrupted",
	// "answer-unknown" and "unknown" as "the outcome is not known", and so
	// a failed capture whose Error starts with "interrupted" (the agent's
	// mark for a request whose answer a stop or crash lost).
	State          string `json:"state"`
	ResponseStatus int    `json:"response_status"`
	DuplicateOf    string `json:"duplicate_of"`
	Queued         bool   `json:"queued"`
	// Error is the store's error text for the capture, if any. Not in the
	// first format note; added so that the checker can tell an interrupted
	// capture from a failed one when State is the store's plain "failed".
	Error string `json:"error,omitempty"`
	// Seat names the claimant (Meta.Claimants) whose agent's store held
	// the capture; empty for the token's default agent.
	Seat string `json:"seat,omitempty"`
}

// History is a whole run, as read back from its folder.
type History struct {
	Meta    Meta
	Sends   []Send
	Handler []Copy
	Faults  []Fault
	Store   []Capture
}

// Read loads the run in dir. meta.json must exist; a missing JSONL file reads
// as empty (a run stopped before its store was read has no store.jsonl). A
// torn last line, as a killed runner leaves, is an error naming the line:
// the checker must not judge a history it cannot read whole.
func Read(dir string) (*History, error) {
	h := &History{}
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	if err := json.Unmarshal(b, &h.Meta); err != nil {
		return nil, fmt.Errorf("history: %s: %w", MetaFile, err)
	}
	if h.Sends, err = readLines[Send](dir, SendsFile); err != nil {
		return nil, err
	}
	if h.Handler, err = readLines[Copy](dir, HandlerFile); err != nil {
		return nil, err
	}
	if h.Faults, err = readLines[Fault](dir, FaultsFile); err != nil {
		return nil, err
	}
	if h.Store, err = readLines[Capture](dir, StoreFile); err != nil {
		return nil, err
	}
	return h, nil
}

func readLines[T any](dir, name string) ([]T, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	defer f.Close()
	var out []T
	r := bufio.NewReader(f)
	for line := 1; ; line++ {
		b, err := r.ReadBytes('\n')
		if len(b) > 0 && !(len(b) == 1 && b[0] == '\n') {
			var v T
			if uerr := json.Unmarshal(b, &v); uerr != nil {
				return nil, fmt.Errorf("history: %s line %d: %w", name, line, uerr)
			}
			out = append(out, v)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("history: %s: %w", name, err)
		}
	}
}

// WriteMeta writes dir/meta.json whole (to a temporary file, then renamed),
// so that a reader never sees half of it.
func WriteMeta(dir string, m Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, MetaFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, MetaFile)); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	return nil
}

// Log appends records to one JSONL file of a run. It is safe for concurrent
// use: each Append writes one whole line and flushes it to the file, so that
// the history up to the last Append survives the chaos program being killed.
type Log[T any] struct {
	mu  sync.Mutex
	f   *os.File      // guarded by mu; nil once closed
	w   *bufio.Writer // guarded by mu
	err error         // guarded by mu; the first write error, kept
}

// Create creates (or truncates) dir/name for appending records of type T,
// e.g. history.Create[history.Send](dir, history.SendsFile).
func Create[T any](dir, name string) (*Log[T], error) {
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return &Log[T]{f: f, w: bufio.NewWriter(f)}, nil
}

// Append writes v as one line and flushes it. After a write error every
// later Append returns that error: a history with a hole must not look whole.
func (l *Log[T]) Append(v T) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if l.f == nil {
		return errors.New("history: append to a closed log")
	}
	l.w.Write(b)
	l.w.WriteByte('\n')
	if err := l.w.Flush(); err != nil {
		l.err = fmt.Errorf("history: %w", err)
	}
	return l.err
}

// Close flushes and closes the file; it reports the first write error, if
// any, so that a caller who ignored Append's errors still learns of a hole.
func (l *Log[T]) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return l.err
	}
	ferr := l.w.Flush()
	cerr := l.f.Close()
	l.f = nil
	if l.err == nil {
		l.err = errors.Join(ferr, cerr)
	}
	return l.err
}
