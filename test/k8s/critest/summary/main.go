// Command summary prints the result of critest runs from their ginkgo JSON
// reports (make conformance): passed, failed and skipped per report and in
// all, then every spec that did not pass, with the first line of why.
//
//	go run ./summary report.json [bench-report.json ...]
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

// report is the part of ginkgo's JSON report (types.Report) read here.
type report struct {
	SuiteDescription string
	SpecReports      []struct {
		ContainerHierarchyTexts []string
		LeafNodeType            string
		LeafNodeText            string
		State                   string
		Failure                 *struct{ Message string }
	}
}

// rank orders the states a spec can have in several reports (critest
// skips the validation specs in the benchmark run and the other way
// round): the worst one counts.
var rank = map[string]int{"skipped": 0, "passed": 1, "pending": 2, "interrupted": 3, "aborted": 3, "panicked": 3, "timedout": 3, "failed": 4}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: summary report.json...")
		os.Exit(2)
	}
	state := map[string]string{} // spec → its state over all reports
	why := map[string]string{}
	for _, path := range os.Args[1:] {
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		var reports []report
		if err := json.Unmarshal(data, &reports); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(1)
		}
		counts := map[string]int{}
		for _, r := range reports {
			for _, s := range r.SpecReports {
				if s.LeafNodeType != "It" {
					continue // suite setup and teardown nodes
				}
				counts[s.State]++
				name := strings.Join(append(s.ContainerHierarchyTexts, s.LeafNodeText), " ")
				if old, ok := state[name]; ok && rank[old] >= rank[s.State] {
					continue
				}
				state[name] = s.State
				why[name] = ""
				if s.Failure != nil {
					msg := strings.Join(strings.Fields(s.Failure.Message), " ")
					if len(msg) > 200 {
						msg = msg[:200] + "…"
					}
					why[name] = msg
				}
			}
		}
		fmt.Printf("%s: %s\n", path, line(counts))
	}
	total := map[string]int{}
	var names []string
	for name, st := range state {
		total[st]++
		if st != "passed" {
			names = append(names, name)
		}
	}
	fmt.Printf("all %d specs: %s\n", len(state), line(total))
	sort.Slice(names, func(i, j int) bool {
		if state[names[i]] != state[names[j]] {
			return rank[state[names[i]]] > rank[state[names[j]]]
		}
		return names[i] < names[j]
	})
	for _, n := range names {
		fmt.Printf("%-8s %s\n", state[n], n)
		if why[n] != "" {
			fmt.Printf("         %s\n", why[n])
		}
	}
}

func line(c map[string]int) string {
	out := fmt.Sprintf("%d passed, %d failed, %d skipped", c["passed"], c["failed"], c["skipped"])
	for state, n := range c {
		if state != "passed" && state != "failed" && state != "skipped" {
			out += fmt.Sprintf(", %d %s", n, state)
		}
	}
	return out
}
