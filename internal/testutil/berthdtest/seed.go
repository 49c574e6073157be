package berthdtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// CloneRecord copies the JSON file name in the record directory src (a
// container's or a sandbox's, as berthd wrote it) to a new directory id
// beside src, edited by edit; subdirs are made empty inside it. Tests and
// benchmarks make thousands of containers and pods this way while berthd
// is stopped, which the restarted berthd then loads as its own: real
// records, without a runc process or a network namespace each.
func CloneRecord(tb testing.TB, src, id, name string, edit func(m map[string]any), subdirs ...string) {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(src, name))
	if err != nil {
		tb.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		tb.Fatalf("parse %s: %v", name, err)
	}
	edit(m)
	if data, err = json.Marshal(m); err != nil {
		tb.Fatal(err)
	}
	dst := filepath.Join(filepath.Dir(src), id)
	for _, d := range append([]string{""}, subdirs...) {
		if err := os.MkdirAll(filepath.Join(dst, d), 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dst, name), data, 0o600); err != nil {
		tb.Fatal(err)
	}
}
