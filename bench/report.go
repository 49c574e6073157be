// Package bench holds berth's benchmarks (make bench): each measures latency
// samples, prints a markdown table and writes JSON under $BENCH_OUT.
package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Series is a named set of latency samples.
type Series struct {
	Name    string          `json:"name"`
	Samples []time.Duration `json:"-"`
}

// Stats summarises a series.
type Stats struct {
	Name  string  `json:"name"`
	N     int     `json:"n"`
	P50ms float64 `json:"p50_ms"`
	P90ms float64 `json:"p90_ms"`
	Maxms float64 `json:"max_ms"`
}

// Summary computes percentiles by nearest rank.
func (s Series) Summary() Stats {
	d := append([]time.Duration(nil), s.Samples...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	st := Stats{Name: s.Name, N: len(d)}
	if len(d) == 0 {
		return st
	}
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	st.P50ms = ms(d[(len(d)-1)*50/100])
	st.P90ms = ms(d[(len(d)-1)*90/100])
	st.Maxms = ms(d[len(d)-1])
	return st
}

// Report prints a markdown table of the series and writes them as JSON to
// $BENCH_OUT/<name>.json when BENCH_OUT is set.
func Report(w io.Writer, name string, series ...Series) error {
	stats := make([]Stats, len(series))
	var b strings.Builder
	fmt.Fprintf(&b, "\n### %s\n\n| what | n | p50 ms | p90 ms | max ms |\n|---|---:|---:|---:|---:|\n", name)
	for i, s := range series {
		stats[i] = s.Summary()
		fmt.Fprintf(&b, "| %s | %d | %.3f | %.3f | %.3f |\n", stats[i].Name, stats[i].N, stats[i].P50ms, stats[i].P90ms, stats[i].Maxms)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	dir := os.Getenv("BENCH_OUT")
	if dir == "" {
		return nil
	}
	data, err := json.MarshalIndent(map[string]any{"benchmark": name, "series": stats, "time": time.Now().UTC()}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".json"), data, 0o644)
}
