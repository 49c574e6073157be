package config

import "testing"

// Validate makes the cgroup driver explicit: empty is cgroupfs, an
// explicit choice stays, anything else is refused.
func TestValidateNormalisesCgroupDriver(t *testing.T) {
	for in, want := range map[string]string{"": CgroupDriverCgroupfs, "cgroupfs": CgroupDriverCgroupfs, "systemd": CgroupDriverSystemd} {
		c := Default()
		c.CgroupDriver = in
		if err := c.Validate(); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if c.CgroupDriver != want {
			t.Errorf("%q validated to %q, want %q", in, c.CgroupDriver, want)
		}
	}
	c := Default()
	c.CgroupDriver = "cgroupv1"
	if err := c.Validate(); err == nil {
		t.Error("cgroup_driver cgroupv1 validated")
	}
}
