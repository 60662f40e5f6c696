package inspector_test

import (
	"testing"

	"github.com/calltap/calltap/inspector"
)

func TestValidInspectHost(t *testing.T) {
	for h, ok := range map[string]bool{
		"inspector.test": true, "fd00::5": true, "[fd00::5]": true,
		"https://inspector.example.com": true, "http://localhost:8080": true,
		"": false, "inspector.test:4040": false, "https://inspector.example.com/ui": false, "ftp://x": false,
	} {
		if err := inspector.ValidInspectHost(h); (err == nil) != ok {
			t.Errorf("ValidInspectHost(%q) = %v, want ok %v", h, err, ok)
		}
	}
}
