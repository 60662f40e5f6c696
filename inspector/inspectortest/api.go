// Package inspectortest is what tests of the inspector's JSON API share,
// whether they start the inspector alone (package inspector's) or a whole
// stack (cmd/e2e): a call of the API and the envelope it answers with.
package inspectortest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Envelope is the inspector's answer: the service's envelope (section
// 2.1 of its documentation), which the inspector's API speaks too.
type Envelope struct {
	Status  bool            `json:"status"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
	Error   *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Request is a request of the API; hdr is name, value pairs, where a
// "Host" sets the request's Host (a name a browser would have sent).
func Request(t testing.TB, method, url, body string, hdr ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return req
}

// Do calls the API (a Request) and returns the status and the envelope.
// A body that is not an envelope, or one whose status and error
// disagree, fails t.
func Do(t testing.TB, method, url, body string, hdr ...string) (int, Envelope) {
	t.Helper()
	resp, err := http.DefaultClient.Do(Request(t, method, url, body, hdr...))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var env Envelope
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatalf("%s %s: not JSON: %s", method, url, b)
	}
	if env.Status != (env.Error == nil) {
		t.Fatalf("%s %s: envelope status/error disagree: %s", method, url, b)
	}
	return resp.StatusCode, env
}
