package config

import (
	"math"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestDefaultUlimits(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []specs.POSIXRlimit
		bad  bool
	}{
		{in: nil},
		{in: []string{"nofile=1024:2048", "core=0"}, want: []specs.POSIXRlimit{
			{Type: "RLIMIT_NOFILE", Soft: 1024, Hard: 2048}, {Type: "RLIMIT_CORE", Soft: 0, Hard: 0}}},
		{in: []string{"memlock=-1"}, want: []specs.POSIXRlimit{{Type: "RLIMIT_MEMLOCK", Soft: math.MaxUint64, Hard: math.MaxUint64}}},
		{in: []string{"nofile=2048:1024"}, bad: true},
		{in: []string{"bogus=1"}, bad: true},
		{in: []string{"nofile"}, bad: true},
		{in: []string{"nofile=1", "nofile=2"}, bad: true},
	} {
		c := Default()
		c.DefaultUlimits = tc.in
		err := c.Validate()
		if (err != nil) != tc.bad {
			t.Fatalf("%v: err %v, want error %v", tc.in, err, tc.bad)
		}
		if tc.bad {
			continue
		}
		got, _ := c.Rlimits()
		if !slices.Equal(got, tc.want) {
			t.Fatalf("%v: %+v, want %+v", tc.in, got, tc.want)
		}
	}
}
