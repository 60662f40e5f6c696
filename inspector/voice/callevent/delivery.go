package callevent

import (
	"net/http"
	"time"
)

// The service's delivery rules (documentation 6.7, 6.8 and 8), shared by
// the emulator that applies them, the agent's replays that imitate them and
// the media downloads that follow them.

// MaxAttempts is how many times the service tries one delivery.
const MaxAttempts = 5

// RetrySchedule is the delay before each attempt (section 6.8). An array
// returned by value, so that no caller can change the schedule for all.
func RetrySchedule() [MaxAttempts]time.Duration {
	return [MaxAttempts]time.Duration{0, 30 * time.Second, 2 * time.Minute, 8 * time.Minute, 32 * time.Minute}
}

// Retryable reports whether the service tries again after an attempt that
// ended with status: network errors and time-outs (status 0), 408, 429 and
// any 5xx are retried; 2xx ends the delivery and any other status (a 4xx
// such as 404 or 401, a misconfigured endpoint) fails it.
func Retryable(status int) bool {
	return status == 0 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500 && status <= 599
}
