package agent

import (
	"testing"
	"time"
)

func TestDeliveryURI(t *testing.T) {
	for _, c := range []struct{ url, public, want string }{
		{"https://relay.example.com/t/abc123/hooks/voice?x=1&x=2", "", "/hooks/voice?x=1&x=2"},
		{"https://relay.example.com/t/abc123", "", "/"},
		{"https://relay.example.com/t/abc123/", "", "/"},
		{"https://relay.example.com/t/abc123/a%2Fb", "", "/a%2Fb"},
		{"https://hooks.example.com/voice/events", "", "/voice/events"},
		{"https://hooks.example.com", "", "/"},
		{"https://dev.example.com/tunnels/alice/voice?k=v", "https://dev.example.com/tunnels/alice", "/voice?k=v"},
		{"https://dev.example.com/tunnels/alice", "https://dev.example.com/tunnels/alice/", "/"},
		{"https://dev.example.com/tunnels/alicex/voice", "https://dev.example.com/tunnels/alice", "/tunnels/alicex/voice"},
		{"https://other.example.com/t/abc/voice", "https://dev.example.com/t/abc", "/voice"},
		{"::not a url", "", "/"},
	} {
		if got := deliveryURI(c.url, c.public); got != c.want {
			t.Errorf("deliveryURI(%q, %q) = %q, want %q", c.url, c.public, got, c.want)
		}
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{2 * time.Hour: "2h", 90 * time.Minute: "1h30m", 30 * time.Second: "30s", 5 * time.Minute: "5m"} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%s) = %q, want %q", d, got, want)
		}
	}
}
