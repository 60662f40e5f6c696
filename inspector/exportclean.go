package inspector

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/calltap/calltap/inspector/agent"
	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage/agentdb"
)

// SecretHeaders lists the headers that carry credentials in the requests the voice service sends
// (section 5: an Authorization header set in event_webhook_headers holds the
// client's secret) or in a handler's answers. An export masks their values
// unless told to keep them. A function, so that no caller can change the
// list for every other.
func SecretHeaders() []string {
	return []string{"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "X-Api-Key"}
}

// MaskedValue stands for a masked header's value: the header stays, so a
// reader sees that it was sent and replay --header can supply it again.
const MaskedValue = "[masked]"

// ExportOptions says what an export selects and what it leaves out.
type ExportOptions struct {
	Filter   agentdb.CaptureFilter
	Mask     []string            // header names whose values are masked (case-insensitive)
	Redactor *callevent.Redactor // nil: bodies as they came
	Progress func(int)           // the count so far, every exportEvery captures and at the end
}

// masks reports whether name is one of the headers to mask.
func (o *ExportOptions) masks(name string) bool {
	for _, m := range o.Mask {
		if strings.EqualFold(m, name) {
			return true
		}
	}
	return false
}

// clean returns what an export writes of c: its secret headers masked and,
// with a Redactor, its personal data replaced, its Content-Length set to
// the body it now has, and its call-event columns read again from that body.
func (o *ExportOptions) clean(c *agentdb.Capture) (*agentdb.Capture, error) {
	if len(o.Mask) == 0 && o.Redactor == nil {
		return c, nil
	}
	out := *c
	var err error
	if out.RequestHeaders, err = o.cleanHeaders(c.RequestHeaders, nil); err != nil {
		return nil, fmt.Errorf("capture %s: request headers: %w", c.ID, err)
	}
	if c.ResponseHeaders != "" {
		if out.ResponseHeaders, err = o.cleanHeaders(c.ResponseHeaders, nil); err != nil {
			return nil, fmt.Errorf("capture %s: response headers: %w", c.ID, err)
		}
	}
	r := o.Redactor
	if r == nil {
		return &out, nil
	}
	for _, part := range []struct {
		headers *string
		body    *[]byte
		what    string
	}{{&out.RequestHeaders, &out.Body, "request"}, {&out.ResponseHeaders, &out.ResponseBody, "answer"}} {
		if err := o.redact(part.headers, part.body, part.what); err != nil {
			return nil, fmt.Errorf("capture %s: %w", c.ID, err)
		}
	}
	out.Path, out.Query, out.Target, out.Error = r.Scrub(c.Path), r.Scrub(c.Query), r.Scrub(c.Target), r.Scrub(c.Error)
	out.Event, out.CallID, out.DeliveryID, out.OccurredAt = "", "", "", ""
	agent.IndexCapture(&out)
	return &out, nil
}

// redact replaces the personal data in one side of a capture (the request
// or the answer, what): its body, then its headers, with Content-Length set
// to the body's new length.
func (o *ExportOptions) redact(headers *string, body *[]byte, what string) error {
	var h wire.Header
	if *headers != "" {
		if err := h.UnmarshalJSON([]byte(*headers)); err != nil {
			return fmt.Errorf("%s headers: %w", what, err)
		}
	}
	// A compressed body cannot be read for what to replace; leaving
	// it as it is would let the data through.
	if enc := h.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") && len(*body) > 0 {
		return fmt.Errorf("its %s body is %s-encoded, which --redact cannot read; leave the capture out of the export (--event, --call-id, --since)", what, enc)
	}
	if len(*body) > 0 {
		*body = o.Redactor.Body(*body)
	}
	if *headers == "" {
		return nil
	}
	n := len(*body)
	var err error
	*headers, err = o.cleanHeaders(*headers, &n)
	return err
}

// cleanHeaders masks the secret values of a header list (JSON, as stored),
// scrubs the rest with the Redactor, and, given the body's new length,
// sets Content-Length to it.
func (o *ExportOptions) cleanHeaders(stored string, bodyLen *int) (string, error) {
	var h wire.Header
	if err := h.UnmarshalJSON([]byte(stored)); err != nil {
		return "", err
	}
	for i, f := range h {
		switch {
		case o.masks(f.Name):
			h[i].Value = MaskedValue
		case bodyLen != nil && http.CanonicalHeaderKey(f.Name) == "Content-Length":
			h[i].Value = strconv.Itoa(*bodyLen)
		case bodyLen != nil:
			h[i].Value = o.Redactor.Scrub(f.Value)
		}
	}
	b, err := h.MarshalJSON()
	return string(b), err
}
