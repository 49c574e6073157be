package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Filtered-out specs (skipped, no message) are not counted; a spec that
// skipped itself is, with its reason.
func TestRun(t *testing.T) {
	report := `[{"SuiteDescription": "E2eNode Suite", "RunTime": 60000000000, "SpecReports": [
	  {"ContainerHierarchyTexts": ["[sig-node] A"], "LeafNodeType": "It", "LeafNodeText": "passes", "State": "passed"},
	  {"ContainerHierarchyTexts": ["[sig-node] A"], "LeafNodeType": "It", "LeafNodeText": "fails", "State": "failed", "Failure": {"Message": "boom\nmore"}},
	  {"ContainerHierarchyTexts": ["[sig-node] B"], "LeafNodeType": "It", "LeafNodeText": "skips itself", "State": "skipped", "Failure": {"Message": "needs cgroup v2"}},
	  {"ContainerHierarchyTexts": ["[sig-node] C"], "LeafNodeType": "It", "LeafNodeText": "filtered", "State": "skipped"},
	  {"LeafNodeType": "SynchronizedBeforeSuite", "State": "passed"}
	]}]`
	path := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(&out, false, []string{path}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"3 specs: 1 passed, 1 failed, 1 skipped (1m0s)", "failed   [sig-node] A fails\n         boom\n", "needs cgroup v2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "filtered") {
		t.Errorf("summary counts a filtered spec:\n%s", out.String())
	}
	out.Reset()
	if err := run(&out, true, []string{path}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| failed | [sig-node] A fails | boom |") {
		t.Errorf("markdown:\n%s", out.String())
	}
}
