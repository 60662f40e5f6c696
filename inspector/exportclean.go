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

// SecretHeaders carry credentials in the requests the voice service sends
// (section 5: an Authorization header set in event_webhook_headers holds the
// client's secret) or in a handler's answers. An export masks their values
// unless told to keep them.
var SecretHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "X-Api-Key"}

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
		var h wire.Header
		if *part.headers != "" {
			if err := h.UnmarshalJSON([]byte(*part.headers)); err != nil {
				return nil, fmt.Errorf("capture %s: %s headers: %w", c.ID, part.what, err)
			}
		}
		// A compressed body cannot be read for what to replace; leaving
		// it as it is would let the data through.
		if enc := h.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") && len(*part.body) > 0 {
			return nil, fmt.Errorf("capture %s: its %s body is %s-encoded, which --redact cannot read; leave the capture out of the export (--event, --call-id, --since)", c.ID, part.what, enc)
		}
		if len(*part.body) > 0 {
			*part.body = r.Body(*part.body)
		}
		if *part.headers == "" {
			continue
		}
		n := len(*part.body)
		if *part.headers, err = o.cleanHeaders(*part.headers, &n); err != nil {
			return nil, err
		}
	}
	out.Path, out.Query, out.Target, out.Error = r.Scrub(c.Path), r.Scrub(c.Query), r.Scrub(c.Target), r.Scrub(c.Error)
	out.Event, out.CallID, out.DeliveryID, out.OccurredAt = "", "", "", ""
	agent.IndexCapture(&out)
	return &out, nil
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
