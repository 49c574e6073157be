// Command summary prints the result of make e2e-node's passes from their
// ginkgo JSON reports: per report and in all, passed, failed and skipped
// among the specs the pass selected (specs its label filter left out are
// not counted), then every spec that did not pass with the first line of
// why. With -markdown it prints every selected spec as a markdown table row
// (docs/conformance.md).
//
//	go run ./test/e2enode/summary [-markdown] parallel/report.json serial/report.json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// report is the part of ginkgo's JSON report (types.Report) read here.
type report struct {
	SuiteDescription string
	RunTime          time.Duration
	SpecReports      []spec
}

type spec struct {
	ContainerHierarchyTexts []string
	LeafNodeType            string
	LeafNodeText            string
	State                   string
	RunTime                 time.Duration
	Failure                 *struct{ Message string }
}

func (s spec) name() string {
	return strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
}

// selected says whether the pass ran the spec: ginkgo reports the specs
// its filters left out as skipped with no message; a spec that skipped
// itself (e2eskipper) says why.
func (s spec) selected() bool {
	return s.LeafNodeType == "It" && (s.State != "skipped" || (s.Failure != nil && s.Failure.Message != ""))
}

func (s spec) why() string {
	if s.Failure == nil {
		return ""
	}
	msg := strings.TrimSpace(s.Failure.Message)
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return msg
}

func main() {
	markdown := flag.Bool("markdown", false, "print every selected spec as a markdown table row")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: summary [-markdown] report.json...")
		os.Exit(2)
	}
	if err := run(os.Stdout, *markdown, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(w io.Writer, markdown bool, paths []string) error {
	total := map[string]int{}
	var notPassed, all []string
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var reports []report
		if err := json.Unmarshal(data, &reports); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		counts := map[string]int{}
		var wall time.Duration
		for _, r := range reports {
			wall += r.RunTime
			for _, s := range r.SpecReports {
				if !s.selected() {
					continue
				}
				counts[s.State]++
				total[s.State]++
				all = append(all, fmt.Sprintf("| %s | %s | %s |", s.State, cell(s.name()), cell(s.why())))
				if s.State != "passed" {
					notPassed = append(notPassed, fmt.Sprintf("%-8s %s\n         %s", s.State, s.name(), s.why()))
				}
			}
		}
		if !markdown {
			fmt.Fprintf(w, "%s: %s (%s)\n", path, line(counts), wall.Round(time.Second))
		}
	}
	if markdown {
		sort.Slice(all, func(i, j int) bool { return specOf(all[i]) < specOf(all[j]) })
		fmt.Fprintln(w, "| result | spec | note |")
		fmt.Fprintln(w, "|---|---|---|")
		for _, l := range all {
			fmt.Fprintln(w, l)
		}
		return nil
	}
	fmt.Fprintf(w, "all: %s\n", line(total))
	sort.Strings(notPassed)
	for _, l := range notPassed {
		fmt.Fprintln(w, l)
	}
	return nil
}

// specOf is the spec column of a markdown row, to sort rows by spec.
func specOf(row string) string {
	parts := strings.SplitN(row, " | ", 3)
	if len(parts) < 2 {
		return row
	}
	return parts[1]
}

func line(c map[string]int) string {
	n := 0
	for _, v := range c {
		n += v
	}
	s := fmt.Sprintf("%d specs: %d passed, %d failed, %d skipped", n, c["passed"], c["failed"], c["skipped"])
	for _, st := range []string{"pending", "interrupted", "aborted", "panicked", "timedout"} {
		if c[st] > 0 {
			s += fmt.Sprintf(", %d %s", c[st], st)
		}
	}
	return s
}

func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
