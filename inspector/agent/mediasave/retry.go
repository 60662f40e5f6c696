package mediasave

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/calltap/calltap/inspector/voice/callevent"
)

// statusError is the error of an answer's status, nil for 2xx, and whether
// it is worth another try: the voice service's own retry rule.
func statusError(st int, callID string) (retry bool, err error) {
	switch {
	case st >= 200 && st < 300:
		return false, nil
	case callevent.Retryable(st):
		return true, fmt.Errorf("HTTP %d", st)
	case st == http.StatusForbidden || st == http.StatusUnauthorized || st == http.StatusGone:
		return false, fmt.Errorf("HTTP %d: the signed link may have expired; `calltap media %s` asks the service for fresh links", st, callID)
	default:
		return false, fmt.Errorf("HTTP %d", st)
	}
}

// pause waits for d, or less if ctx ends first; it reports whether it
// waited the whole d.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}
