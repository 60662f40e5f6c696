package routes

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// Load reads and checks the route file at path. Its error names the file
// and the line: "routes.toml:7: route "media": ...".
func Load(path string, opts ...Option) (*Table, error) {
	t, _, err := LoadBytes(path, opts...)
	return t, err
}

// Parse checks a route file's contents; name is the file's name for errors.
func Parse(name string, data []byte, opts ...Option) (*Table, error) {
	t, err := parse(data)
	if err != nil {
		var le *lineError
		if errors.As(err, &le) {
			return nil, fmt.Errorf("%s:%d: %s", name, le.line, le.msg)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for _, o := range opts {
		o(t)
	}
	if err := checkGlobs(t.events); err != nil {
		return nil, fmt.Errorf("event filter: %w", err)
	}
	return t, nil
}

// fileDoc and routeDoc are the file as TOML decodes it, before the checks.
type fileDoc struct {
	Route []routeDoc `toml:"route"`
}

type routeDoc struct {
	Name      string            `toml:"name"`
	Events    []string          `toml:"events"`
	Match     map[string]string `toml:"match"`
	Header    map[string]string `toml:"header"`
	Path      string            `toml:"path"`
	ForwardTo string            `toml:"forward-to"`
	StoreOnly bool              `toml:"store-only"`
}

// lineError is an error at a line of the file.
type lineError struct {
	line int
	msg  string
}

func (e *lineError) Error() string { return fmt.Sprintf("%d: %s", e.line, e.msg) }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// parse decodes data strictly (an unknown key is an error, at its line)
// and checks each route, naming the line of the key at fault.
func parse(data []byte) (*Table, error) {
	var doc fileDoc
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, decodeError(err)
	}
	lines := keyLines(data)
	t := &Table{fields: newTrie(), paths: []string{"event", "call.call_id"}}
	t.fields.add("event", 0)
	t.fields.add("call.call_id", 1)
	seen := map[string]int{}
	for i := range doc.Route {
		r, err := t.compile(&doc.Route[i], lines.route(i))
		if err != nil {
			return nil, err
		}
		if first, dup := seen[r.Name]; dup {
			return nil, lines.at(i, "name").errf("route %q: name already used by the route at line %d", r.Name, first)
		}
		seen[r.Name] = r.Line
		t.routes = append(t.routes, r)
		t.usesHeaders = t.usesHeaders || len(r.header) > 0
	}
	return t, nil
}

// decodeError gives a decoder's error its line.
func decodeError(err error) error {
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) && len(strict.Errors) > 0 {
		e := &strict.Errors[0]
		row, _ := e.Position()
		return &lineError{row, fmt.Sprintf("unknown key %q", strings.Join(e.Key(), "."))}
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, _ := de.Position()
		return &lineError{row, de.Error()}
	}
	return err
}

// compile checks one route and adds its match paths to the table's fields.
func (t *Table) compile(d *routeDoc, at routeLines) (*Route, error) {
	r := &Route{Name: d.Name, Line: at.header(), path: d.Path, StoreOnly: d.StoreOnly}
	if !nameRE.MatchString(d.Name) || d.Name == DefaultName || d.Name == FilteredName {
		return nil, at.at("name").errf("route %q: name must be letters, digits, '.', '_' or '-', and not %q or %q", d.Name, DefaultName, FilteredName)
	}
	if err := r.setTarget(d, at); err != nil {
		return nil, err
	}
	if len(d.Events)+len(d.Match)+len(d.Header) == 0 && d.Path == "" {
		return nil, at.at("name").errf("route %q: no events, match, header or path: write events = [\"*\"] for a route that takes every request", d.Name)
	}
	if err := checkGlobs(d.Events); err != nil {
		return nil, at.at("events").errf("route %q: events: %v", d.Name, err)
	}
	r.events = d.Events
	if _, err := path.Match(d.Path, ""); err != nil {
		return nil, at.at("path").errf("route %q: path %q: %v", d.Name, d.Path, err)
	}
	for _, k := range sortedKeys(d.Match) {
		if !validDotPath(k) {
			return nil, at.at("match", k).errf("route %q: match %q: not a dot path (call.variables.name)", d.Name, k)
		}
		r.match = append(r.match, matchEntry{path: k, slot: t.slot(k), want: d.Match[k]})
	}
	for _, k := range sortedKeys(d.Header) {
		if k == "" || strings.ContainsAny(k, " :\t\r\n") {
			return nil, at.at("header", k).errf("route %q: header %q: not a header name", d.Name, k)
		}
		r.header = append(r.header, headerEntry{name: http.CanonicalHeaderKey(k), want: d.Header[k]})
	}
	return r, nil
}

// setTarget checks that the route has exactly one of forward-to and
// store-only = true.
func (r *Route) setTarget(d *routeDoc, at routeLines) error {
	switch {
	case d.ForwardTo != "" && d.StoreOnly:
		return at.at("store-only").errf("route %q: forward-to and store-only both set", d.Name)
	case d.StoreOnly:
		return nil
	case d.ForwardTo == "":
		return at.at("name").errf("route %q: neither forward-to nor store-only = true", d.Name)
	}
	u, err := url.Parse(d.ForwardTo)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return at.at("forward-to").errf("route %q: forward-to %q: not an absolute http or https URL", d.Name, d.ForwardTo)
	}
	r.ForwardTo = u
	return nil
}

// slot is the index of the body field at dot path p, added when new.
func (t *Table) slot(p string) int {
	for i, q := range t.paths {
		if q == p {
			return i
		}
	}
	t.paths = append(t.paths, p)
	t.fields.add(p, len(t.paths)-1)
	return len(t.paths) - 1
}

func checkGlobs(globs []string) error {
	for _, g := range globs {
		if g == "" {
			return errors.New("an empty kind")
		}
		if _, err := path.Match(g, ""); err != nil {
			return fmt.Errorf("%q: %v", g, err)
		}
	}
	return nil
}

func validDotPath(p string) bool {
	for seg := range strings.SplitSeq(p, ".") {
		if seg == "" {
			return false
		}
	}
	return true
}

// keyLines indexes the lines of a file's keys, route by route, from the
// parser's own positions: the decoder reports where a value fails to
// decode, this says where a value that decoded fails a check.
func keyLines(data []byte) fileLines {
	fl := fileLines{keys: map[string]int{}}
	p := unstable.Parser{}
	p.Reset(data)
	route, table := -1, ""
	for p.NextExpression() {
		e := p.Expression()
		key := keyParts(e)
		line := 0
		if k := e.Key(); k.Next() {
			line = p.Shape(k.Node().Raw).Start.Line
		}
		switch e.Kind {
		case unstable.ArrayTable:
			if len(key) == 1 && key[0] == "route" {
				route++
				fl.headers = append(fl.headers, line)
			}
			table = ""
		case unstable.Table:
			table = strings.Join(key[min(1, len(key)):], "\x00")
			fl.keys[lineKey(route, table)] = line
		case unstable.KeyValue:
			fl.addKeyValue(&p, route, table, key, e, line)
		}
	}
	return fl
}

// addKeyValue records a key's line, and those of an inline table's keys.
func (fl fileLines) addKeyValue(p *unstable.Parser, route int, table string, key []string, e *unstable.Node, line int) {
	name := strings.Join(key, "\x00")
	if table != "" {
		name = table + "\x00" + name
	}
	fl.keys[lineKey(route, name)] = line
	if v := e.Value(); v.Kind == unstable.InlineTable {
		for it := v.Children(); it.Next(); {
			kv := it.Node()
			if k := kv.Key(); k.Next() {
				fl.keys[lineKey(route, name+"\x00"+strings.Join(keyParts(kv), "\x00"))] = p.Shape(k.Node().Raw).Start.Line
			}
		}
	}
}

func keyParts(n *unstable.Node) []string {
	var parts []string
	for it := n.Key(); it.Next(); {
		parts = append(parts, string(it.Node().Data))
	}
	return parts
}

func lineKey(route int, key string) string { return fmt.Sprintf("%d\x00%s", route, key) }

// fileLines are the lines of a file's [[route]] headers and keys.
type fileLines struct {
	headers []int
	keys    map[string]int // lineKey(route, key parts joined by NUL) -> line
}

func (fl fileLines) route(i int) routeLines { return routeLines{fl, i} }

func (fl fileLines) at(i int, key ...string) lineAt { return fl.route(i).at(key...) }

// routeLines are the lines of one route's keys.
type routeLines struct {
	fl fileLines
	i  int
}

func (rl routeLines) header() int {
	if rl.i < len(rl.fl.headers) {
		return rl.fl.headers[rl.i]
	}
	return 0
}

// at is the line of a key of the route, or the route's header line when
// the key is not in the file.
func (rl routeLines) at(key ...string) lineAt {
	if n, ok := rl.fl.keys[lineKey(rl.i, strings.Join(key, "\x00"))]; ok {
		return lineAt(n)
	}
	if len(key) > 1 {
		return rl.at(key[0])
	}
	return lineAt(rl.header())
}

type lineAt int

func (l lineAt) errf(format string, args ...any) error {
	return &lineError{int(l), fmt.Sprintf(format, args...)}
}

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
