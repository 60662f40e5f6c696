package inspector

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
)

// requiredHeadersFile, in the data directory, lists the names of the
// headers `listen --require-header` made senders present: their values are
// the senders' secrets, which an export masks. Names only, one a line.
const requiredHeadersFile = "required-headers"

// ExportMask is the header names an export of the data directory dataDir
// masks: SecretHeaders, the headers senders had to present to its agents
// (RecordRequiredHeaders) and extra, each once (case aside), in that order.
func ExportMask(dataDir string, extra []string) ([]string, error) {
	required, err := requiredHeaderNames(dataDir)
	if err != nil {
		return nil, err
	}
	return headerNames(SecretHeaders(), required, extra), nil
}

// RecordRequiredHeaders adds the names of require ("Name: value"), the
// headers an agent makes every sender present, to the data directory's
// list, keeping those of earlier runs: captures of those runs hold their
// values.
func RecordRequiredHeaders(dataDir string, require []string) error {
	if len(require) == 0 {
		return nil
	}
	known, err := requiredHeaderNames(dataDir)
	if err != nil {
		return err
	}
	var names []string
	for _, r := range require {
		if name, _, ok := strings.Cut(r, ":"); ok && strings.TrimSpace(name) != "" {
			names = append(names, strings.TrimSpace(name))
		}
	}
	all := headerNames(known, names)
	if len(all) == len(known) {
		return nil
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dataDir, requiredHeadersFile), []byte(strings.Join(all, "\n")+"\n"), 0o600)
}

// requiredHeaderNames reads requiredHeadersFile; none when it is absent.
func requiredHeaderNames(dataDir string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, requiredHeadersFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// headerNames is the names of lists, each once (case aside), in the order
// given.
func headerNames(lists ...[]string) []string {
	var out []string
	seen := map[string]bool{}
	for _, l := range lists {
		for _, name := range l {
			key := strings.ToLower(name)
			if !seen[key] {
				seen[key] = true
				out = append(out, name)
			}
		}
	}
	return out
}
