package liveconfig

import (
	"reflect"
	"testing"

	"github.com/berthcri/berth/internal/config"
)

func TestRuntimeOptionsFollowTheCgroupDriver(t *testing.T) {
	for _, tc := range []struct {
		driver string
		in     []string
		want   []string
	}{
		{"", []string{"--debug"}, []string{"--debug"}},
		{"cgroupfs", nil, nil},
		{"systemd", nil, []string{"--systemd-cgroup"}},
		{"systemd", []string{"--debug"}, []string{"--debug", "--systemd-cgroup"}},
		{"systemd", []string{"--systemd-cgroup"}, []string{"--systemd-cgroup"}},
	} {
		if got := RuntimeOptions(tc.driver, tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("RuntimeOptions(%q, %v) = %v, want %v", tc.driver, tc.in, got, tc.want)
		}
	}
	cfg := config.Default()
	cfg.State = "/run/x"
	cfg.CgroupDriver = "systemd"
	cfg.RuntimeHandlers = map[string]config.RuntimeHandler{"runc": {Binary: "runc"}, "crun": {Binary: "crun", Options: []string{"--debug"}}}
	rts := Runtimes(cfg)
	if got := rts["runc"].Options; !reflect.DeepEqual(got, []string{"--systemd-cgroup"}) {
		t.Errorf("runc handler options %v", got)
	}
	if got := rts["crun"].Options; !reflect.DeepEqual(got, []string{"--debug", "--systemd-cgroup"}) {
		t.Errorf("crun handler options %v", got)
	}
	if cfg.RuntimeHandlers["crun"].Options[0] != "--debug" || len(cfg.RuntimeHandlers["crun"].Options) != 1 {
		t.Errorf("config handler options were modified: %v", cfg.RuntimeHandlers["crun"].Options)
	}
}
