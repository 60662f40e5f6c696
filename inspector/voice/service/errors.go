package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// Kinds of failure, for errors.Is on an *Error.
var (
	ErrUnauthorized = errors.New("the API key was refused")          // 401
	ErrForbidden    = errors.New("the API key lacks a scope")        // 403
	ErrNotFound     = errors.New("not found")                        // 404
	ErrRateLimited  = errors.New("rate limited")                     // 429, after the retries
	ErrNetwork      = errors.New("the service could not be reached") // no HTTP answer
	ErrNotService   = errors.New("not the service's API")            // an answer without the envelope
)

// Error is a failed API request. Its message is one line that says what to
// do; Kind tells the failures apart (errors.Is(err, ErrNotFound)).
type Error struct {
	Kind       error  // one of the Err* kinds; nil for other failures
	Op         string // "GET /webhooks/{id}/" as sent, relative to the base URL
	URL        string // the base URL, for network errors
	What       string // what was not found: "delivery 8a1f…"
	Status     int    // HTTP status; 0 when none came
	Code       string // the service's error code, when it gave one
	Message    string // the service's error message, when it gave one
	RetryAfter time.Duration
	Retries    int   // how many times a 429 was retried before giving up
	Err        error // the transport's error, for ErrNetwork
}

func (e *Error) Unwrap() []error {
	var out []error
	if e.Kind != nil {
		out = append(out, e.Kind)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

func (e *Error) Error() string {
	detail := ""
	if e.Message != "" {
		detail = ": " + oneLine(e.Message)
	}
	switch e.Kind {
	case ErrUnauthorized:
		return "the API key was refused (401): check CALLTAP_API_KEY or api_key in the config file"
	case ErrForbidden:
		return fmt.Sprintf("the API key may not %s (403%s): give it the scope (webhooks:read to read the delivery log, webhooks:write to replay)", e.Op, detail)
	case ErrNotFound:
		if e.What != "" {
			return fmt.Sprintf("%s not found (404)", e.What)
		}
		return fmt.Sprintf("%s: not found (404): check --base-url, which ends in /api/v1/ext/", e.Op)
	case ErrRateLimited:
		s := fmt.Sprintf("the service is rate limiting requests (429) and still was after %d retries", e.Retries)
		if e.RetryAfter > 0 {
			s += fmt.Sprintf("; try again in %s", e.RetryAfter.Round(time.Second))
		}
		return s
	case ErrNetwork:
		return fmt.Sprintf("cannot reach the service at %s: %s", e.URL, describeNetErr(e.Err))
	case ErrNotService:
		return fmt.Sprintf("%s answered HTTP %d without the service's JSON envelope: check --base-url (%s), which ends in /api/v1/ext/", e.Op, e.Status, e.URL)
	}
	code := ""
	if e.Code != "" {
		code = " " + e.Code
	}
	if e.Status != 0 {
		return fmt.Sprintf("%s: HTTP %d%s%s", e.Op, e.Status, code, detail)
	}
	return e.Op + detail
}

// apiError reads an error response: the envelope's error object when there
// is one (its shape is "not shown": {code, message} or a plain string).
func apiError(op, what string, status int, raw []byte) *Error {
	e := &Error{Op: op, What: what, Status: status}
	switch status {
	case http.StatusUnauthorized:
		e.Kind = ErrUnauthorized
	case http.StatusForbidden:
		e.Kind = ErrForbidden
	case http.StatusNotFound:
		e.Kind = ErrNotFound
	case http.StatusTooManyRequests:
		e.Kind = ErrRateLimited
	}
	var env envelope
	if json.Unmarshal(raw, &env) != nil || env.Status == nil {
		if e.Kind == nil || e.Kind == ErrNotFound && what == "" {
			// An answer that is not the API's at all: most likely the base
			// URL points somewhere else.
			e.Kind = ErrNotService
		}
		return e
	}
	var obj struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Detail  string `json:"detail"`
	}
	var s string
	switch {
	case json.Unmarshal(env.Error, &obj) == nil:
		e.Code, e.Message = obj.Code, obj.Message
		if e.Message == "" {
			e.Message = obj.Detail
		}
	case json.Unmarshal(env.Error, &s) == nil:
		e.Message = s
	}
	if e.Message == "" {
		e.Message = env.Message
	}
	return e
}

// describeNetErr says what went wrong below HTTP, in the words a developer
// would search for.
func describeNetErr(err error) string {
	var dns *net.DNSError
	var op *net.OpError
	var ne net.Error
	switch {
	case err == nil:
		return "no answer"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "no answer in time (timed out)"
	case errors.As(err, &dns):
		return "the host name does not resolve (" + dns.Name + ")"
	case errors.As(err, &op) && op.Op == "dial":
		return oneLine(op.Err.Error())
	}
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) && ue.Unwrap() != nil {
		return oneLine(ue.Unwrap().Error())
	}
	return oneLine(err.Error())
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i] + " …"
	}
	return s
}
