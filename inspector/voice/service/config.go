package service

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// DefaultConfigPath is $XDG_CONFIG_HOME/calltap/config or
// ~/.config/calltap/config.
func DefaultConfigPath() string {
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "calltap", "config")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".config", "calltap", "config")
	}
	return filepath.Join(".calltap", "config")
}

// ReadConfig reads the config file of the service's address and API key:
// key = value lines (base_url, api_key), # comments. An unknown key is an error, so that a
// typo does not silently fall back to another setting.
func ReadConfig(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' && v[len(v)-1] == '"' || v[0] == '\'' && v[len(v)-1] == '\'') {
			v = v[1 : len(v)-1]
		}
		switch {
		case !ok:
			return nil, fmt.Errorf("%s line %d: want key = value", path, n)
		case k != "base_url" && k != "api_key":
			return nil, fmt.Errorf("%s line %d: unknown key %q (base_url and api_key are known)", path, n, k)
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return out, nil
}
