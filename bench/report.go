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

// Throughput is a named set of runs that each processed Bytes.
type Throughput struct {
	Name    string          `json:"name"`
	Bytes   int64           `json:"bytes"`
	Samples []time.Duration `json:"-"`
}

// ThroughputStats summarises a throughput series in MB/s (10^6 bytes/s).
type ThroughputStats struct {
	Name      string  `json:"name"`
	N         int     `json:"n"`
	MB        float64 `json:"mb"`
	P50MBps   float64 `json:"p50_mb_per_s"`
	WorstMBps float64 `json:"worst_mb_per_s"`
	BestMBps  float64 `json:"best_mb_per_s"`
}

// Summary computes the median, worst and best rates.
func (t Throughput) Summary() ThroughputStats {
	st := Series{Name: t.Name, Samples: t.Samples}.Summary()
	mb := float64(t.Bytes) / 1e6
	rate := func(ms float64) float64 {
		if ms == 0 {
			return 0
		}
		return mb / (ms / 1000)
	}
	out := ThroughputStats{Name: t.Name, N: st.N, MB: mb, P50MBps: rate(st.P50ms), WorstMBps: rate(st.Maxms)}
	if len(t.Samples) > 0 {
		best := t.Samples[0]
		for _, s := range t.Samples {
			best = min(best, s)
		}
		out.BestMBps = rate(float64(best.Microseconds()) / 1000)
	}
	return out
}

// ReportThroughput prints a markdown table of MB/s per series and writes
// them as JSON to $BENCH_OUT/<name>.json when BENCH_OUT is set.
func ReportThroughput(w io.Writer, name string, series ...Throughput) error {
	stats := make([]ThroughputStats, len(series))
	var b strings.Builder
	fmt.Fprintf(&b, "\n### %s\n\n| what | n | MB per run | p50 MB/s | worst MB/s | best MB/s |\n|---|---:|---:|---:|---:|---:|\n", name)
	for i, s := range series {
		stats[i] = s.Summary()
		fmt.Fprintf(&b, "| %s | %d | %.2f | %.1f | %.1f | %.1f |\n", stats[i].Name, stats[i].N, stats[i].MB, stats[i].P50MBps, stats[i].WorstMBps, stats[i].BestMBps)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	dir := os.Getenv("BENCH_OUT")
	if dir == "" {
		return nil
	}
	data, err := json.MarshalIndent(map[string]any{"benchmark": name, "throughput": stats, "time": time.Now().UTC()}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".json"), data, 0o644)
}
