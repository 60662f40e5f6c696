package wire

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"unicode/utf8"
)

// Header is an ordered list of header fields. Unlike a map it keeps repeats
// and their order, which is what the sender sent.
type Header []HeaderField

// HeaderField is one header line.
type HeaderField struct {
	Name  string
	Value string
}

// MarshalJSON renders a Header as [[name, value], ...]. A name or value
// that is not UTF-8 (a sender may put any byte but a control in a value)
// goes as [name, value, "base64"] with both in base64, so that every byte
// comes back: JSON would turn it into U+FFFD.
func (h Header) MarshalJSON() ([]byte, error) {
	fields := make([][]string, len(h))
	for i, f := range h {
		if utf8.ValidString(f.Name) && utf8.ValidString(f.Value) {
			fields[i] = []string{f.Name, f.Value}
			continue
		}
		fields[i] = []string{base64.StdEncoding.EncodeToString([]byte(f.Name)), base64.StdEncoding.EncodeToString([]byte(f.Value)), "base64"}
	}
	return json.Marshal(fields)
}

// UnmarshalJSON reads [[name, value], ...], with [name, value, "base64"]
// for a field in base64.
func (h *Header) UnmarshalJSON(b []byte) error {
	var fields [][]string
	if err := json.Unmarshal(b, &fields); err != nil {
		return err
	}
	out := make(Header, len(fields))
	for i, f := range fields {
		switch {
		case len(f) == 2:
			out[i] = HeaderField{f[0], f[1]}
		case len(f) == 3 && f[2] == "base64":
			name, err := base64.StdEncoding.DecodeString(f[0])
			if err != nil {
				return fmt.Errorf("header %d: name: %w", i+1, err)
			}
			value, err := base64.StdEncoding.DecodeString(f[1])
			if err != nil {
				return fmt.Errorf("header %d: value: %w", i+1, err)
			}
			out[i] = HeaderField{string(name), string(value)}
		default:
			return fmt.Errorf("header %d: want [name, value] or [name, value, \"base64\"]", i+1)
		}
	}
	*h = out
	return nil
}

// Get returns the first value of name (case-insensitive).
func (h Header) Get(name string) string {
	for _, f := range h {
		if http.CanonicalHeaderKey(f.Name) == http.CanonicalHeaderKey(name) {
			return f.Value
		}
	}
	return ""
}

// HeaderFrom flattens an http.Header. Go's server has already merged the
// wire order into per-name slices; names come out in the order Go keeps
// (sorted) with each name's values in arrival order.
func HeaderFrom(hh http.Header, host string) Header {
	out := make(Header, 0, len(hh)+1)
	if host != "" {
		out = append(out, HeaderField{"Host", host})
	}
	for _, name := range sortedKeys(hh) {
		for _, v := range hh[name] {
			out = append(out, HeaderField{name, v})
		}
	}
	return out
}

// Apply adds every field to hh, keeping repeats.
func (h Header) Apply(hh http.Header) {
	for _, f := range h {
		hh.Add(f.Name, f.Value)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
