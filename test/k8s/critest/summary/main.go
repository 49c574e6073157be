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

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: summary report.json...")
		os.Exit(2)
	}
	total := map[string]int{}
	var notPassed []string
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
				total[s.State]++
				if s.State == "passed" {
					continue
				}
				why := ""
				if s.Failure != nil {
					why, _, _ = strings.Cut(strings.TrimSpace(s.Failure.Message), "\n")
				}
				name := strings.Join(append(s.ContainerHierarchyTexts, s.LeafNodeText), " ")
				notPassed = append(notPassed, fmt.Sprintf("%-8s %s\n         %s", s.State, name, why))
			}
		}
		fmt.Printf("%s: %s\n", path, line(counts))
	}
	fmt.Printf("total: %s\n", line(total))
	sort.Strings(notPassed)
	for _, n := range notPassed {
		fmt.Println(strings.TrimRight(n, " \n"))
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
