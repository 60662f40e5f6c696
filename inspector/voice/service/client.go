// Package service is a client of the voice service's API (documentation
// section 4): the delivery log (GET /webhooks/, GET /webhooks/{id}/), replay
// (POST /webhooks/replay/) and a call's media links. It speaks the
// documented envelope (2.1) and paging rules (4.7), and turns the failures a
// developer meets — a refused key, a missing scope, an unknown id, rate
// limiting, an unreachable service — into errors of one clear line.
//
// The same client works against the real service and against calltap's
// emulator (package emulator), which is how it is tested.
package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults of a Client.
const (
	// PageSize is the page size a walk asks for: the documented maximum,
	// so a walk takes as few requests as the service allows.
	PageSize = 200
	// maxResponse bounds a response body. A page of 200 delivery items or
	// one delivery with its payload is far smaller.
	maxResponse = 32 << 20
	// maxRetries is how many times a request answered 429 is tried again.
	maxRetries = 3
	// maxRetryWait caps a single Retry-After wait; a service asking for
	// longer gets an error that says when to come back.
	maxRetryWait = 30 * time.Second
	// maxWalkPages stops a walk that never ends (a count that keeps
	// growing faster than we read, or a service that ignores offset).
	maxWalkPages = 10000
)

// Client calls the voice service's API. It is safe for concurrent use.
type Client struct {
	base      *url.URL // ends in "/": paths are resolved against it
	key       string
	http      *http.Client
	userAgent string
}

// Option adjusts a Client.
type Option func(*Client)

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// New returns a client of the service at baseURL, the documentation's
// {base_url}, which ends in api/v1/ext (a trailing slash is added).
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("base URL %q: want an http(s) URL ending in /api/v1/ext/", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("base URL %q: no query or fragment, just the address ending in /api/v1/ext/", baseURL)
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
		if u.RawPath != "" {
			u.RawPath += "/"
		}
	}
	if apiKey == "" {
		return nil, errors.New("no API key: set CALLTAP_API_KEY or api_key in the config file")
	}
	if strings.ContainsAny(apiKey, " \t\r\n") {
		return nil, errors.New("the API key contains white space: check CALLTAP_API_KEY")
	}
	c := &Client{
		base:      u,
		key:       apiKey,
		userAgent: "calltap",
		http: &http.Client{
			Timeout: 60 * time.Second,
			Transport: &http.Transport{
				Proxy:                 http.ProxyFromEnvironment,
				DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
				TLSHandshakeTimeout:   10 * time.Second,
				ResponseHeaderTimeout: 30 * time.Second,
				IdleConnTimeout:       90 * time.Second,
				MaxIdleConnsPerHost:   8,
				ForceAttemptHTTP2:     true,
			},
		},
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// BaseURL is the service's base address, ending in "/".
func (c *Client) BaseURL() string { return c.base.String() }

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// envelope is the documented response envelope (2.1). The error object's
// shape is "not shown", so it is kept raw and read leniently.
type envelope struct {
	Status  *bool           `json:"status"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
	Error   json.RawMessage `json:"error"`
}

// call is one API request: what it is, for error messages, and where.
type call struct {
	method string
	path   string     // relative to the base URL, e.g. "webhooks/"
	query  url.Values // may be nil
	body   any        // JSON request body; nil for none
	what   string     // what a 404 means: "delivery 123", "the media of call 456"
}

// do sends cl, retrying after 429 within the client's bounds, and decodes
// the envelope's data into out.
func (c *Client) do(ctx context.Context, cl call, out any) error {
	rel := &url.URL{Path: cl.path}
	if cl.query != nil {
		rel.RawQuery = cl.query.Encode()
	}
	target := c.base.ResolveReference(rel).String()
	var body []byte
	if cl.body != nil {
		var err error
		if body, err = json.Marshal(cl.body); err != nil {
			return err
		}
	}
	op := cl.method + " " + "/" + cl.path
	for try := 0; ; try++ {
		status, header, raw, err := c.roundTrip(ctx, cl.method, target, body, op)
		if err != nil {
			return err
		}
		if status == http.StatusTooManyRequests {
			wait, known := retryAfter(header.Get("Retry-After"), time.Now())
			if !known {
				wait = time.Second << try // no hint: back off 1 s, 2 s, 4 s
			}
			if try < maxRetries && wait <= maxRetryWait {
				if err := sleepCtx(ctx, wait); err != nil {
					return err
				}
				continue
			}
			e := apiError(op, cl.what, status, raw)
			e.RetryAfter, e.Retries = wait, try
			return e
		}
		return c.decode(op, cl.what, status, raw, out)
	}
}

// roundTrip sends one request and reads its answer, at most maxResponse
// bytes of it.
func (c *Client) roundTrip(ctx context.Context, method, target string, body []byte, op string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, nil, ctx.Err()
		}
		return 0, nil, nil, &Error{Kind: ErrNetwork, Op: op, URL: c.base.String(), Err: err}
	}
	raw, rerr := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	resp.Body.Close()
	if rerr != nil {
		if ctx.Err() != nil {
			return 0, nil, nil, ctx.Err()
		}
		return 0, nil, nil, &Error{Kind: ErrNetwork, Op: op, URL: c.base.String(), Err: fmt.Errorf("reading the response: %w", rerr)}
	}
	if len(raw) > maxResponse {
		return 0, nil, nil, &Error{Op: op, Status: resp.StatusCode, Message: fmt.Sprintf("the response is larger than %d MiB", maxResponse>>20)}
	}
	return resp.StatusCode, resp.Header, raw, nil
}

// decode reads an answer other than 429: an error for a failing status or
// a false status in the envelope, else the envelope's data into out.
func (c *Client) decode(op, what string, status int, raw []byte, out any) error {
	if status >= 300 {
		return apiError(op, what, status, raw)
	}
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil || env.Status == nil {
		return &Error{Kind: ErrNotService, Op: op, Status: status, URL: c.base.String()}
	}
	if !*env.Status {
		e := apiError(op, what, status, raw)
		if e.Message == "" {
			e.Message = env.Message
		}
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		return &Error{Op: op, Status: status, Message: "the response's data is not what the documentation describes: " + err.Error()}
	}
	return nil
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
