package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Comparison holds the samples of every series per endpoint.
type Comparison struct {
	Endpoints []string
	// Series maps "workload: series" → endpoint → samples.
	Series map[string]map[string][]time.Duration
	// Order keeps series in the order they were first measured.
	Order []string
	// Skipped maps endpoint → workloads it could not run, with why.
	Skipped map[string][]string
	Scale   map[string]ScaleResult
	// Floors maps a series name to the floor measured next to it.
	Floors map[string]*FloorSeries
}

// FloorSeries is the samples of one floor.
type FloorSeries struct {
	Name    string
	Samples []time.Duration
}

// NewComparison prepares a comparison of the named endpoints.
func NewComparison(endpoints ...string) *Comparison {
	return &Comparison{Endpoints: endpoints, Series: map[string]map[string][]time.Duration{},
		Skipped: map[string][]string{}, Scale: map[string]ScaleResult{}, Floors: map[string]*FloorSeries{}}
}

func (c *Comparison) add(series, endpoint string, d time.Duration) {
	m, ok := c.Series[series]
	if !ok {
		m = map[string][]time.Duration{}
		c.Series[series] = m
		c.Order = append(c.Order, series)
	}
	m[endpoint] = append(m[endpoint], d)
}

// warmup samples run before measuring and are discarded.
const warmup = 3

// samples is a workload's sample count, or $BENCH_SAMPLES when set: more
// samples for a before/after on a noisy machine.
func samples(n int) int {
	if v, err := strconv.Atoi(os.Getenv("BENCH_SAMPLES")); err == nil && v > 0 {
		return v
	}
	return n
}

// Run measures w on every endpoint, alternating endpoints sample by sample
// so that drift of the machine hits all of them alike.
func (c *Comparison) Run(ctx context.Context, w Workload, eps ...*Endpoint) {
	states := map[*Endpoint]any{}
	live := []*Endpoint{}
	for _, ep := range eps {
		var st any
		var err error
		if w.Setup != nil {
			st, err = w.Setup(ctx, ep)
		}
		if err != nil {
			c.skip(ep.Name, w.Name, err)
			if w.Teardown != nil && st != nil {
				w.Teardown(ctx, ep, st)
			}
			continue
		}
		states[ep] = st
		live = append(live, ep)
	}
	floor, floorState := w.Floor, any(nil)
	if floor != nil && floor.Setup != nil {
		var err error
		if floorState, err = floor.Setup(ctx); err != nil {
			c.skip("floor", floor.Name, err)
			floor = nil
		}
	}
	var floorSamples *FloorSeries
	if floor != nil {
		floorSamples = &FloorSeries{Name: floor.Name}
		c.Floors[w.Name+": "+floor.Bounds] = floorSamples
	}
	warm := warmup
	if w.Warmup > 0 {
		warm = w.Warmup
	}
	failed := map[*Endpoint]bool{}
	for i := 0; i < warm+samples(w.Samples); i++ {
		for _, ep := range live {
			if failed[ep] {
				continue
			}
			ds, err := w.Sample(ctx, ep, states[ep], i)
			if err != nil {
				c.skip(ep.Name, w.Name, err)
				failed[ep] = true
				continue
			}
			if i < warm {
				continue
			}
			keys := make([]string, 0, len(ds))
			for k := range ds {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				c.add(w.Name+": "+k, ep.Name, ds[k])
			}
		}
		if floor == nil || failed[nil] {
			continue
		}
		d, err := floor.Sample(ctx, floorState, i)
		if err != nil {
			c.skip("floor", floor.Name, err)
			failed[nil] = true // an endpoint-less key: the floor
			continue
		}
		if i >= warm {
			floorSamples.Samples = append(floorSamples.Samples, d)
		}
	}
	for _, ep := range live {
		if w.Teardown != nil {
			w.Teardown(ctx, ep, states[ep])
		}
	}
	if floor != nil && floor.Teardown != nil {
		floor.Teardown(ctx, floorState)
	}
}

func (c *Comparison) skip(endpoint, workload string, err error) {
	why := err.Error()
	if errors.Is(err, errUnsupported) {
		why = "unsupported"
	}
	c.Skipped[endpoint] = append(c.Skipped[endpoint], fmt.Sprintf("%s (%s)", workload, firstLine(why)))
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	if len(line) > 400 {
		line = line[:400] + "…"
	}
	return line
}

type comparisonJSON struct {
	Time      time.Time              `json:"time"`
	Endpoints []string               `json:"endpoints"`
	Series    []seriesJSON           `json:"series"`
	Skipped   map[string][]string    `json:"skipped"`
	Scale     map[string]ScaleResult `json:"scale"`
}

type seriesJSON struct {
	Name  string           `json:"name"`
	Stats map[string]Stats `json:"stats"`
	// Floor is the floor measured next to this series, if any.
	Floor *Stats `json:"floor,omitempty"`
}

// Write prints the markdown table to w and, when dir is set, writes
// compare.json and compare.png there.
func (c *Comparison) Write(w io.Writer, dir string) error {
	var b strings.Builder
	// With more than two endpoints the ratio is first / last (berth /
	// the reference, which comes last).
	two := len(c.Endpoints) >= 2
	last := len(c.Endpoints) - 1
	b.WriteString("\n| workload | ")
	for _, e := range c.Endpoints {
		fmt.Fprintf(&b, "%s p50 / p90 / max ms | ", e)
	}
	if two {
		fmt.Fprintf(&b, "p50 ratio %s/%s | ", c.Endpoints[0], c.Endpoints[last])
	}
	fmt.Fprintf(&b, "floor p50 / p90 / max ms | p50 ratio %s/floor |\n|---|", c.Endpoints[0])
	for range c.Endpoints {
		b.WriteString("---:|")
	}
	if two {
		b.WriteString("---:|")
	}
	b.WriteString("---:|---:|\n")
	out := comparisonJSON{Time: time.Now().UTC(), Endpoints: c.Endpoints, Skipped: c.Skipped, Scale: c.Scale}
	ratio := func(a, b float64) string {
		if a > 0 && b > 0 {
			return fmt.Sprintf("%.2f×", a/b)
		}
		return "—"
	}
	for _, name := range c.Order {
		sj := seriesJSON{Name: name, Stats: map[string]Stats{}}
		fmt.Fprintf(&b, "| %s | ", name)
		var p50 []float64
		for _, e := range c.Endpoints {
			samples := c.Series[name][e]
			if len(samples) == 0 {
				b.WriteString("— | ")
				p50 = append(p50, 0)
				continue
			}
			st := Series{Name: name, Samples: samples}.Summary()
			sj.Stats[e] = st
			p50 = append(p50, st.P50ms)
			fmt.Fprintf(&b, "%.2f / %.2f / %.2f | ", st.P50ms, st.P90ms, st.Maxms)
		}
		if two {
			fmt.Fprintf(&b, "%s | ", ratio(p50[0], p50[last]))
		}
		if f := c.Floors[name]; f != nil && len(f.Samples) > 0 {
			st := Series{Name: f.Name, Samples: f.Samples}.Summary()
			sj.Floor = &st
			fmt.Fprintf(&b, "%s: %.2f / %.2f / %.2f | %s |", f.Name, st.P50ms, st.P90ms, st.Maxms, ratio(p50[0], st.P50ms))
		} else {
			b.WriteString("| |")
		}
		b.WriteString("\n")
		out.Series = append(out.Series, sj)
	}
	if len(c.Scale) > 0 {
		b.WriteString("\n| scale | pods | parallel | up pods/s | down pods/s | runtime processes | runtime PSS MiB |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, e := range c.Endpoints {
			if s, ok := c.Scale[e]; ok {
				fmt.Fprintf(&b, "| %s | %d | %d | %.1f | %.1f | %d | %.1f |\n", e, s.Pods, s.Parallel, s.UpPodsPerSec, s.DownPerSec, s.Processes, float64(s.PSSKiB)/1024)
			}
		}
	}
	for _, e := range append(append([]string(nil), c.Endpoints...), "floor") {
		for _, s := range c.Skipped[e] {
			fmt.Fprintf(&b, "\n- %s skipped: %s", e, s)
		}
	}
	b.WriteString("\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if dir == "" {
		return nil
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "compare.json"), data, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "compare.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	return c.chart(filepath.Join(dir, "compare.png"))
}

// chart draws every series' latency distribution as box plots, one box per
// endpoint side by side, on a log scale so fast and slow calls both show.
func (c *Comparison) chart(path string) error {
	if len(c.Order) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = "berth benchmark: latency distributions (ms, log scale)"
	p.Y.Label.Text = "ms"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	width := vg.Points(11)
	groups := append(append([]string(nil), c.Endpoints...), "floor")
	legend := map[int]bool{}
	top := 0.0
	var names []string
	for si, name := range c.Order {
		names = append(names, shortName(name))
		for gi, g := range groups {
			samples := c.Series[name][g]
			if g == "floor" {
				samples = nil
				if f := c.Floors[name]; f != nil {
					samples = f.Samples
				}
			}
			if len(samples) == 0 {
				continue
			}
			vals := make(plotter.Values, len(samples))
			for i, d := range samples {
				ms := float64(d.Microseconds()) / 1000
				if ms <= 0 {
					ms = 0.001
				}
				vals[i] = ms
			}
			box, err := plotter.NewBoxPlot(width, float64(si), vals)
			if err != nil {
				return err
			}
			box.Offset = width * vg.Length(float64(gi)-float64(len(groups)-1)/2) * 1.1
			color := palette[gi%len(palette)]
			if g == "floor" {
				color = floorColor
			}
			box.FillColor = color
			p.Add(box)
			for _, v := range vals {
				top = max(top, v)
			}
			if !legend[gi] {
				legend[gi] = true
				swatch, _ := plotter.NewPolygon(plotter.XYs{{X: 0, Y: 0}})
				swatch.Color = color
				label := g
				if g == "floor" {
					label = "floor (tools alone, no runtime)"
				}
				p.Legend.Add(label, swatch)
			}
		}
	}
	// Head room on the log axis so the legend never covers a box.
	p.Y.Max = top * 6
	p.NominalX(names...)
	// Room for the outer boxes of the first and last groups.
	p.X.Min, p.X.Max = -0.7, float64(len(names)-1)+0.7
	p.X.Tick.Label.Rotation = 0.6
	p.X.Tick.Label.XAlign = -0.9
	p.Legend.Top = true
	w := vg.Length(len(c.Order)) * vg.Centimeter * 2.8
	if w < 16*vg.Centimeter {
		w = 16 * vg.Centimeter
	}
	return p.Save(w, 16*vg.Centimeter, path)
}

func shortName(s string) string {
	if _, after, ok := strings.Cut(s, ": "); ok {
		s = after
	}
	if len(s) > 44 {
		s = s[:44] + "…"
	}
	return s
}
