package service

import (
	"bufio"
	"cmp"
	"errors"
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

// ErrNotConfigured marks a missing or broken setting of the service's
// address or key: the user's to fix (a usage error), not the service's.
var ErrNotConfigured = errors.New("the service is not configured")

type configError struct{ msg string }

func (e *configError) Error() string   { return e.msg }
func (e *configError) Is(t error) bool { return t == ErrNotConfigured }

// Settings say where Open finds the service's address and key besides the
// environment.
type Settings struct {
	BaseURL    string // given on the command line: before $CALLTAP_BASE_URL and the file
	ConfigFile string // the config file; "" for DefaultConfigPath, which may be absent
	// Warn is told of a config file that holds the API key and that
	// others can read; nil: nobody is.
	Warn func(string)
}

// Open builds a client of the service at the address s.BaseURL, else
// $CALLTAP_BASE_URL, else base_url of the config file, with the key
// $CALLTAP_API_KEY, else api_key of the config file. The key is never a
// flag: it would show in ps and shell history. A setting missing or
// broken is an error that is ErrNotConfigured.
func Open(s Settings, opts ...Option) (*Client, error) {
	path, explicit := s.ConfigFile, s.ConfigFile != ""
	if !explicit {
		path = DefaultConfigPath()
	}
	file, err := ReadConfig(path)
	switch {
	case errors.Is(err, os.ErrNotExist) && !explicit:
		file = map[string]string{}
	case err != nil:
		return nil, &configError{err.Error()}
	}
	base := cmp.Or(s.BaseURL, os.Getenv("CALLTAP_BASE_URL"), file["base_url"])
	if base == "" {
		return nil, &configError{"no base URL: give --base-url, set CALLTAP_BASE_URL or base_url in " + path}
	}
	key := os.Getenv("CALLTAP_API_KEY")
	if key == "" {
		key = file["api_key"]
		if key != "" && s.Warn != nil && othersRead(path) {
			s.Warn(path + " holds an API key and others can read it; chmod 600 it")
		}
	}
	if key == "" {
		return nil, &configError{"no API key: set CALLTAP_API_KEY or api_key in " + path}
	}
	c, err := New(base, key, opts...)
	if err != nil {
		return nil, &configError{err.Error()}
	}
	return c, nil
}

// othersRead says whether users other than its owner may read the file
// at path.
func othersRead(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().Perm()&0o077 != 0
}
