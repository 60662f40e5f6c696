package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
	"github.com/calltap/calltap/storage/servicedb"
)

// Delivery status values. The documentation shows only pending.
const (
	StatusPending   = "pending"   // an attempt is due or under way
	StatusDelivered = "delivered" // the target answered 2xx
	StatusFailed    = "failed"    // a 4xx not retried, a 3xx, or the attempts ran out
)

// maxResponseBody is how much of a target's answer is kept.
const maxResponseBody = 64 << 10

// UserAgent is sent with every delivery. The documentation does not say
// which headers besides the configured ones a delivery carries.
const UserAgent = "calltap-mock-service/1"

// Run delivers webhooks until ctx is cancelled: it claims the deliveries
// that are due, tries each (at most Workers at once, one per call at a
// time, so a call's events are first tried in the order they occur), and
// sleeps until the next is due or a dispatch or replay wakes it. State is
// in the database, so a restart picks up where the last run stopped. Run
// returns when every attempt under way has finished.
func (s *Server) Run(ctx context.Context) error {
	if err := s.db.ResetInflight(ctx); err != nil {
		return fmt.Errorf("emulator: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// done carries the end of an attempt back to the loop; buffered to the
	// number of workers, so a worker never waits on it.
	done := make(chan struct{}, s.cfg.Workers)
	inflight := 0 // owned by this goroutine
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if free := s.cfg.Workers - inflight; free > 0 {
			due, err := s.db.ClaimDueDeliveries(ctx, s.now(), free)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				s.cfg.Log.Error("claim deliveries", "err", err)
			}
			for _, d := range due {
				inflight++
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.attempt(ctx, d)
					done <- struct{}{}
				}()
			}
		}
		// Sleep until the next delivery is due; with every worker busy,
		// until one finishes.
		wait := time.Hour
		if inflight < s.cfg.Workers {
			if at, ok, err := s.db.NextDeliveryDue(ctx); err == nil && ok {
				wait = max(at.Sub(s.now()), 0)
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-done:
			inflight--
		case <-s.wake:
		case <-timer.C:
		}
	}
}

// attempt makes one attempt at d and records it.
func (s *Server) attempt(ctx context.Context, d *servicedb.Delivery) {
	try := d.Attempts + 1
	started := s.now()
	status, body, errText := s.post(ctx, d)
	if ctx.Err() != nil {
		// The emulator is stopping: the target did nothing wrong. The
		// delivery stays due and is tried again at the next start.
		s.db.ReleaseDelivery(context.WithoutCancel(ctx), d.ID)
		return
	}
	finished := s.now()
	a := &servicedb.Attempt{Try: try, At: started, ResponseStatus: status, ResponseBody: body, Error: errText, Duration: finished.Sub(started)}
	o := servicedb.AttemptOutcome{Status: StatusFailed}
	switch {
	case status >= 200 && status < 300:
		o.Status, o.DeliveredAt = StatusDelivered, finished
	case callevent.Retryable(status) && try < d.MaxAttempts && try < callevent.MaxAttempts:
		o.Status, o.NextAt = StatusPending, finished.Add(s.scaled(callevent.RetrySchedule()[try]))
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.db.FinishAttempt(wctx, d.ID, d.Round, a, o); err != nil {
		s.cfg.Log.Error("record attempt", "delivery", d.ID, "err", err)
		s.db.ReleaseDelivery(wctx, d.ID)
		return
	}
	line := []any{"delivery", d.ID, "event", d.Event, "call_id", d.CallID, "attempt", try, "url", d.URL,
		"duration", a.Duration.Round(time.Millisecond), "status", o.Status}
	if status != 0 {
		line = append(line, "response_status", status)
	}
	if errText != "" {
		line = append(line, "error", errText)
	}
	if !o.NextAt.IsZero() {
		line = append(line, "next_attempt", o.NextAt.Sub(finished).Round(time.Millisecond))
	}
	s.cfg.Log.Info("webhook", line...)
}

// post sends d's payload. It returns the response status (0 when none came)
// with up to maxResponseBody bytes of the body, and the error text of a
// failed attempt.
func (s *Server) post(ctx context.Context, d *servicedb.Delivery) (status int, body []byte, errText string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(d.Payload))
	if err != nil {
		return 0, nil, "build request: " + err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", UserAgent)
	var headers [][2]string
	if err := json.Unmarshal([]byte(d.Headers), &headers); err != nil {
		return 0, nil, "stored headers: " + err.Error()
	}
	for _, h := range headers {
		req.Header.Set(h[0], h[1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, describeError(err, s.cfg.DeliveryTimeout)
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	// Drain a little more so the connection can be reused; give up on
	// anything bigger.
	io.CopyN(io.Discard, resp.Body, 256<<10)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		// The body is not read by the documentation's rules (6.7); a
		// failure to read it does not undo the delivery.
		return resp.StatusCode, body, ""
	case err != nil:
		return resp.StatusCode, body, fmt.Sprintf("HTTP %d; reading the body: %s", resp.StatusCode, describeError(err, s.cfg.DeliveryTimeout))
	case callevent.Retryable(resp.StatusCode):
		return resp.StatusCode, body, fmt.Sprintf("HTTP %d", resp.StatusCode)
	default:
		return resp.StatusCode, body, fmt.Sprintf("HTTP %d: not retried", resp.StatusCode)
	}
}

// describeError turns a client error into the error text of an attempt.
func describeError(err error, timeout time.Duration) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return fmt.Sprintf("timed out after %s", timeout)
	}
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner.Error()
		}
	}
	return err.Error()
}
