//go:build !linux

package disktest

import "testing"

const notLinux = "disktest: this test mounts a size-limited tmpfs, which needs Linux and root; run it on Linux as root (as CI does)"

func mount(t testing.TB, _ int64) string          { t.Fatal(notLinux); return "" }
func available(t testing.TB, _ string) int64      { t.Fatal(notLinux); return 0 }
func fill(t testing.TB, _ string, _ int64) func() { t.Fatal(notLinux); return nil }
