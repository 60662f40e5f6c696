// Live forwarding: a request for a connected agent crosses the websocket
// and its sender gets the handler's answer.

package relay

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/calltap/calltap/relay/api"
	"github.com/calltap/calltap/relay/frameconn"
	"github.com/calltap/calltap/relay/wire"
)

// forward sends a live request to the agent and relays its answer.
// sender is the sender's context: its end means nobody waits for the answer.
func (s *Server) forward(w http.ResponseWriter, sender context.Context, ac *agentConn, req *wire.Request, buf *bytes.Buffer, log reqLogger) {
	ctx, cancel := context.WithTimeout(sender, s.cfg.ForwardTimeout)
	defer cancel()
	// A relay stopping whose grace ran out answers what still waits.
	defer context.AfterFunc(s.abandon, cancel)()
	resp, acked, err := ac.roundTrip(ctx, req, buf, func() { s.enqueue(w, sender, ac.t, req, log) })
	switch {
	case err == nil:
		defer resp.release()
		ac.t.delivered.Add(1)
	case errors.Is(err, errRequeued):
		return // queued from a frozen agent: its sender has its answer
	case errors.Is(err, errAgentLeft), errors.Is(err, errAgentFrozen):
		// The agent is stopping, or frozen: the request waits in the
		// queue, behind what the frozen agent was sent (away).
		defer frameconn.PutBuf(buf)
		ac.away()
		s.enqueue(w, sender, ac.t, req, log)
		return
	case sender.Err() == nil && s.abandon.Err() != nil:
		log.Warn("relay stopped before the local handler answered", "saved", acked)
		s.refuseStopping(w)
		return
	case errors.Is(err, wire.ErrFrameTooLarge):
		// Written, it would have closed the websocket under every request in flight.
		log.Warn("request larger than the agent reads", "size", len(req.Body), "agent_max_frame", ac.PeerMax())
		s.fail(w, api.Errorf(http.StatusRequestEntityTooLarge, api.CodeTooLarge, "the request is larger than the agent accepts (%d bytes with its headers)", ac.PeerMax()))
		return
	case errors.Is(err, context.DeadlineExceeded) && sender.Err() == nil:
		log.Warn("local handler too slow", "timeout", s.cfg.ForwardTimeout, "saved", acked)
		s.fail(w, api.Errorf(http.StatusGatewayTimeout, api.CodeGatewayTimeout, "the local handler did not answer within %s", s.cfg.ForwardTimeout))
		return
	case sender.Err() != nil:
		return // the sender went away
	case acked:
		log.Warn("agent lost after saving the request", "err", err)
		w.Header().Set("Retry-After", "5") // the handler may not have seen it
		s.fail(w, api.Errorf(http.StatusBadGateway, api.CodeBadGateway, "the agent saved the request but disconnected before the local handler answered"))
		return
	default:
		log.Warn("agent lost before it confirmed saving the request", "err", err)
		w.Header().Set("Retry-After", "5")
		s.fail(w, api.Errorf(http.StatusServiceUnavailable, api.CodeAgentOffline, "the agent disconnected before it confirmed saving the request; retry"))
		return
	}
	switch resp.Result {
	case wire.ResultUnreachable:
		s.fail(w, api.Errorf(http.StatusBadGateway, api.CodeBadGateway, "the local handler could not be reached: %s", resp.Error))
		return
	case wire.ResultTimeout:
		s.fail(w, api.Errorf(http.StatusGatewayTimeout, api.CodeGatewayTimeout, "the local handler did not answer in time"))
		return
	case wire.ResultTooLarge:
		s.fail(w, api.Errorf(http.StatusBadGateway, api.CodeBadGateway, "the local handler's answer could not be relayed: %s", resp.Error))
		return
	case wire.ResultQueued:
		log.Info("queued by the agent behind earlier requests", "method", req.Method, "uri", req.URI)
		s.answerQueued(w, req.ID, "queued: the agent saved the request and delivers it after the ones that arrived before it")
		return
	}
	s.writeAnswer(w, resp.Status, resp.Header, resp.Body)
	log.Debug("forwarded", "method", req.Method, "uri", req.URI, "status", resp.Status)
}

// writeAnswer gives the sender the handler's answer, without the headers
// that belong to one connection.
func (s *Server) writeAnswer(w http.ResponseWriter, status int, header wire.Header, body []byte) {
	h := w.Header()
	for _, f := range header {
		if api.ConnectionHeader(f.Name) {
			continue
		}
		h.Add(f.Name, f.Value)
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	n, _ := w.Write(body)
	s.metrics.bytesOut.Add(int64(n))
	s.metrics.countStatus(status)
}

// reqLogger logs with the tunnel and request ids.
type reqLogger struct {
	l       *slog.Logger
	tunnel  string
	request string // empty until the request has an id
}

func (l reqLogger) log(level slog.Level, msg string, args ...any) {
	if !l.l.Enabled(context.Background(), level) {
		return
	}
	args = append([]any{"tunnel", l.tunnel}, args...)
	if l.request != "" {
		args = append(args, "request", l.request)
	}
	l.l.Log(context.Background(), level, msg, args...)
}

func (l reqLogger) Debug(msg string, args ...any) { l.log(slog.LevelDebug, msg, args...) }
func (l reqLogger) Info(msg string, args ...any)  { l.log(slog.LevelInfo, msg, args...) }
func (l reqLogger) Warn(msg string, args ...any)  { l.log(slog.LevelWarn, msg, args...) }
func (l reqLogger) Error(msg string, args ...any) { l.log(slog.LevelError, msg, args...) }
