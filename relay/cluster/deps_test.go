package cluster_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The team relay's package shares the relay's types (storage/relaystate)
// without linking SQLite: a node's state is in NATS, and the cgo driver
// would only cost its build a C compiler.
func TestClusterLinksNoSQLite(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/calltap/calltap/relay/cluster").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "github.com/mattn/go-sqlite3" || pkg == "github.com/calltap/calltap/storage" {
			t.Errorf("relay/cluster links %s", pkg)
		}
	}
}
