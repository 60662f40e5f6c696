package agent

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/wire"
	"github.com/calltap/calltap/storage"
)

// Error codes of the agent's refusals, in the envelope's error object.
const (
	codeDiskFull = "disk_full"
	codeNotSaved = "not_saved"
	codeStopping = "agent_stopping"
)

// refusal is the answer to a live request the agent could not save (err:
// why) before it forwarded it, or, err being errStopped, did not forward:
// 503 with Retry-After, in the service's envelope, so that the sender
// retries. It names the cause but not the error itself, whose paths are
// the developer's. A request the handler may have had is answered
// refusalAfterForward instead.
func refusal(err error) *wire.Response {
	code, msg := codeNotSaved, "the agent could not save the request; retry"
	switch {
	case storage.IsDiskFull(err):
		code, msg = codeDiskFull, "the agent could not save the request: disk full on the agent's machine; retry"
	case errors.Is(err, errStopped):
		code, msg = codeStopping, "the agent is stopping: the request was not forwarded; retry"
	}
	return refusalResponse(code, msg)
}

// refusalAfterForward is the answer to a live request the agent forwarded
// to the handler, or may have (the fast path does not wait to know), and
// then could not save (err: why): 503 with Retry-After, so that the sender
// retries, but coded outcome_unknown, since the handler may have the
// request. Its sender cannot tell more than from a connection dropped
// without an answer, and the code says so.
func refusalAfterForward(err error) *wire.Response {
	cause := "the agent could not save the request"
	if storage.IsDiskFull(err) {
		cause += " (disk full on the agent's machine)"
	}
	return refusalResponse(api.CodeOutcomeUnknown, cause+" after forwarding it: it may have reached the local handler; retry")
}

// refusalResponse is a 503 with Retry-After and the envelope naming code.
func refusalResponse(code, msg string) *wire.Response {
	body, _ := json.Marshal(api.Envelope{Message: msg, Error: &api.Error{Code: code, Message: msg}})
	return &wire.Response{
		Status: http.StatusServiceUnavailable,
		Header: wire.Header{{Name: "Content-Type", Value: "application/json; charset=utf-8"}, {Name: "Retry-After", Value: "5"}},
		Body:   append(body, '\n'),
	}
}
