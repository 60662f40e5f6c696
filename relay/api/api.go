// Package api is the HTTP face shared by every JSON API calltap serves — the
// relay's error bodies, the inspector and the voice service emulator. It
// implements the voice service documentation's response envelope (section
// 2.1), its page object (2.2) and its paging rules (4.7), so that a client
// written for the service reads calltap's answers the same way. It imports
// only the standard library and sits under relay, the lowest layer that
// answers HTTP, so that relay, inspector and web all import it downward.
package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// Paging limits of the service documentation, section 4.7 and 8.
const (
	DefaultLimit = 50
	MaxLimit     = 200
)

// Envelope is the body of every response (documentation section 2.1).
type Envelope struct {
	Status  bool   `json:"status"`
	Message string `json:"message"`
	Data    any    `json:"data"`
	Error   *Error `json:"error"`
}

// Error is the error object of a failed response. The documentation leaves
// its shape "not shown"; calltap uses a stable machine code and a sentence.
type Error struct {
	Status  int    `json:"-"` // HTTP status it is served with
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Error codes calltap answers with, each with its HTTP status.
const (
	CodeInvalid         = "invalid_request"     // 400
	CodeUnauthorized    = "unauthorized"        // 401
	CodeForbidden       = "forbidden"           // 403
	CodeNotFound        = "not_found"           // 404
	CodeMethod          = "method_not_allowed"  // 405
	CodeRequestTimeout  = "request_timeout"     // 408
	CodeTooLarge        = "payload_too_large"   // 413
	CodeRateLimited     = "rate_limited"        // 429
	CodeInternal        = "internal"            // 500
	CodeStoreDamaged    = "store_damaged"       // 500: a database file calltap cannot read
	CodeBadGateway      = "bad_gateway"         // 502
	CodeUnavailable     = "unavailable"         // 503
	CodeGatewayTimeout  = "gateway_timeout"     // 504
	CodeQueueFull       = "queue_full"          // 503
	CodeAgentOffline    = "agent_offline"       // 503
	CodeOutcomeUnknown  = "outcome_unknown"     // 503: the request may have reached the local handler; its answer is not known
	CodeHeaderRejected  = "sender_not_accepted" // 401
	CodeUnsupportedType = "unsupported_media"   // 415
	CodeClaimConflict   = "claim_conflict"      // 409: a claim another agent of the token holds, or too many claims
)

// Errorf builds an *Error.
func Errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// NotFound is the error for a missing what (404 not_found).
func NotFound(what string) *Error {
	return Errorf(http.StatusNotFound, CodeNotFound, "%s not found", what)
}

// Invalid is the error for a bad request (400 invalid_request).
func Invalid(format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, CodeInvalid, format, args...)
}

// WriteData writes a success envelope with status 200 (or the one given).
func WriteData(w http.ResponseWriter, status int, message string, data any) {
	if message == "" {
		message = "ok"
	}
	write(w, status, Envelope{Status: true, Message: message, Data: data})
}

// WriteError writes err as an error envelope. An error that is not an
// *Error is reported as a 500 without its text, which may hold internals,
// unless it says how it is answered (storage's damaged files).
func WriteError(w http.ResponseWriter, err error) {
	var e *Error
	var told interface{ APIError() (int, string, string) }
	if errors.As(err, &told) {
		status, code, message := told.APIError()
		e = Errorf(status, code, "%s", message)
	} else if !errors.As(err, &e) {
		e = Errorf(http.StatusInternalServerError, CodeInternal, "internal error")
	}
	status := e.Status
	if status == 0 {
		status = http.StatusInternalServerError
	}
	write(w, status, Envelope{Status: false, Message: e.Message, Data: nil, Error: e})
}

func write(w http.ResponseWriter, status int, env Envelope) {
	body, err := json.Marshal(env)
	if err != nil {
		status = http.StatusInternalServerError
		body = []byte(`{"status":false,"message":"internal error","data":null,"error":{"code":"internal","message":"internal error"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}

// Page is the page object of the documentation (section 2.2).
type Page[T any] struct {
	Count   int `json:"count"`   // rows matching, ignoring limit and offset
	Limit   int `json:"limit"`   // the real page size
	Offset  int `json:"offset"`  // rows skipped
	Results []T `json:"results"` // never null
}

// NewPage builds a page, turning a nil slice into [].
func NewPage[T any](count, limit, offset int, results []T) Page[T] {
	if results == nil {
		results = []T{}
	}
	return Page[T]{Count: count, Limit: limit, Offset: offset, Results: results}
}

// ParsePage reads limit and offset by the rules of section 4.7: limit
// defaults to 50 and a larger value than 200 is silently served as 200; a
// negative or non-numeric value is a 400.
func ParsePage(q url.Values) (limit, offset int, err error) {
	limit, offset = DefaultLimit, 0
	if s := q.Get("limit"); s != "" {
		n, perr := strconv.Atoi(s)
		if perr != nil || n < 0 {
			return 0, 0, Invalid("limit must be a non-negative integer, got %q", s)
		}
		limit = min(n, MaxLimit)
		if n == 0 {
			limit = DefaultLimit
		}
	}
	if s := q.Get("offset"); s != "" {
		n, perr := strconv.Atoi(s)
		if perr != nil || n < 0 {
			return 0, 0, Invalid("offset must be a non-negative integer, got %q", s)
		}
		offset = n
	}
	return limit, offset, nil
}

// DecodeJSON reads a JSON request body of at most max bytes into v.
func DecodeJSON(w http.ResponseWriter, r *http.Request, max int64, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, max)
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return Errorf(http.StatusRequestEntityTooLarge, CodeTooLarge, "request body is larger than %d bytes", max)
		}
		return Invalid("request body is not valid JSON: %v", err)
	}
	return nil
}

// ConnectionHeader reports a header that describes one hop's connection or
// the framing of the body on it (hop-by-hop, and Content-Length): each hop
// sets its own, so none is passed on from one connection to the next.
func ConnectionHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Te", "Trailer", "Content-Length":
		return true
	}
	return false
}
