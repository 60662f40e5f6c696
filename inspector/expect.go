package inspector

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/calltap/calltap/storage/agentdb"
)

// Expect is what a replayed request's answer must be, as `calltap replay
// --call --expect --expect-body-json` asks: a status class (2xx) or a
// status, and path=value checks of the answer's JSON body.
type Expect struct {
	Status string   // "2xx", "200", …; "" checks nothing
	JSON   []string // path=value each
}

// CallReplayResult is one replayed request and what did not match.
type CallReplayResult struct {
	Original string   `json:"original_id"`
	ID       string   `json:"id"`
	Event    string   `json:"event"`
	Status   int      `json:"response_status"`
	Error    string   `json:"error,omitempty"`
	Failures []string `json:"failures"` // what did not match the expectations
}

// Validate checks the expectations' form.
func (e Expect) Validate() error {
	if e.Status != "" {
		if _, _, err := StatusRange(e.Status); err != nil {
			return err
		}
	}
	for _, j := range e.JSON {
		if p, _, ok := strings.Cut(j, "="); !ok || p == "" {
			return fmt.Errorf("--expect-body-json %q: want path=value", j)
		}
	}
	return nil
}

// StatusRange reads an expected status: a class such as 2xx, or one.
func StatusRange(s string) (int, int, error) {
	if len(s) == 3 && strings.HasSuffix(s, "xx") && s[0] >= '1' && s[0] <= '5' {
		base := int(s[0]-'0') * 100
		return base, base + 99, nil
	}
	if n, err := strconv.Atoi(s); err == nil && n >= 100 && n <= 599 {
		return n, n, nil
	}
	return 0, 0, fmt.Errorf("--expect %q: want a status class such as 2xx or a status such as 200", s)
}

// Check holds the replay c of orig against the expectations.
func (e Expect) Check(orig, c *agentdb.Capture) CallReplayResult {
	res := CallReplayResult{Original: orig.ID, ID: c.ID, Event: orig.Event, Status: c.ResponseStatus, Error: c.Error, Failures: []string{}}
	if res.Event == "" {
		res.Event = orig.Method + " " + orig.Path
	}
	if e.Status != "" {
		if lo, hi, _ := StatusRange(e.Status); c.ResponseStatus < lo || c.ResponseStatus > hi {
			got := "got no answer"
			if c.Error != "" {
				got += " (" + c.Error + ")"
			}
			if c.ResponseStatus > 0 {
				got = "answered " + strconv.Itoa(c.ResponseStatus)
			}
			res.Failures = append(res.Failures, fmt.Sprintf("%s, want %s", got, e.Status))
		}
	}
	for _, j := range e.JSON {
		if msg := checkBodyJSON(c.ResponseBody, j); msg != "" {
			res.Failures = append(res.Failures, msg)
		}
	}
	return res
}

// checkBodyJSON checks one path=value against an answer's JSON body; ""
// when it holds. A value is compared as JSON when it parses as JSON (true,
// 3, "x"), else as a string.
func checkBodyJSON(body []byte, expr string) string {
	path, want, _ := strings.Cut(expr, "=")
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Sprintf("the answer is not JSON, want %s", expr)
	}
	for _, key := range strings.Split(path, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Sprintf("the answer has no %s", path)
		}
		if v, ok = obj[key]; !ok {
			return fmt.Sprintf("the answer has no %s", path)
		}
	}
	var wantV any
	if json.Unmarshal([]byte(want), &wantV) != nil {
		wantV = want
	}
	gotJSON, _ := json.Marshal(v)
	wantJSON, _ := json.Marshal(wantV)
	if string(gotJSON) != string(wantJSON) {
		return fmt.Sprintf("%s is %s, want %s", path, gotJSON, wantJSON)
	}
	return ""
}
