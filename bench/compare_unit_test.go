package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestComparisonWrite checks the table, JSON and chart from synthetic
// samples: floors land next to the series they bound, with the ratio.
func TestComparisonWrite(t *testing.T) {
	c := NewComparison("berth", "ref")
	for i := 1; i <= 30; i++ {
		c.add("pod: RunPodSandbox", "berth", time.Duration(20+i)*time.Millisecond)
		c.add("pod: RunPodSandbox", "ref", time.Duration(40+i)*time.Millisecond)
		c.add("list: ListContainers", "berth", time.Duration(i)*time.Millisecond/10)
	}
	f := &FloorSeries{Name: "netns + ADD"}
	for i := 1; i <= 30; i++ {
		f.Samples = append(f.Samples, time.Duration(10+i)*time.Millisecond)
	}
	c.Floors["pod: RunPodSandbox"] = f
	dir := t.TempDir()
	var out bytes.Buffer
	if err := c.Write(&out, dir); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	var pod, list string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "| pod: RunPodSandbox |"):
			pod = l
		case strings.HasPrefix(l, "| list: ListContainers |"):
			list = l
		}
	}
	// p50 by nearest rank of 21..50 ms is 35, of 41..70 is 55, of 11..40 is 25.
	if want := "| pod: RunPodSandbox | 35.00 / 47.00 / 50.00 | 55.00 / 67.00 / 70.00 | 0.64× | netns + ADD: 25.00 / 37.00 / 40.00 | 1.40× |"; pod != want {
		t.Errorf("pod row:\n got %s\nwant %s", pod, want)
	}
	if cells := strings.Count(list, "|"); cells != strings.Count(pod, "|") {
		t.Errorf("row without floor has %d separators, want %d: %s", cells, strings.Count(pod, "|"), list)
	}
	var js comparisonJSON
	data, err := os.ReadFile(filepath.Join(dir, "compare.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &js); err != nil {
		t.Fatal(err)
	}
	if len(js.Series) != 2 || js.Series[0].Floor == nil || js.Series[0].Floor.P50ms != 25 || js.Series[1].Floor != nil {
		t.Errorf("compare.json series: %+v", js.Series)
	}
	png, err := os.ReadFile(filepath.Join(dir, "compare.png"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("compare.png is not a PNG")
	}
	if keep := os.Getenv("BENCH_TEST_PNG"); keep != "" {
		os.WriteFile(keep, png, 0o644)
	}
}
