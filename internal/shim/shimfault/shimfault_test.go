package shimfault

import "testing"

func TestArmed(t *testing.T) {
	for _, c := range []struct {
		v    string
		p    Point
		want int
	}{
		{"", MonitorMidAdopt, 0},
		{"monitor-mid-adopt", MonitorMidAdopt, 1},
		{"keeper-mid-create, monitor-mid-adopt=3", MonitorMidAdopt, 3},
		{"keeper-mid-create", MonitorMidAdopt, 0},
		{"monitor-mid-adopt=x", MonitorMidAdopt, 0},
	} {
		if got := armed(c.v, c.p); got != c.want {
			t.Errorf("armed(%q, %s) = %d, want %d", c.v, c.p, got, c.want)
		}
	}
}

func TestHitDisarmedReturns(t *testing.T) {
	file := t.TempDir() + "/faults"
	t.Setenv(EnvVar, file)
	Hit(KeeperMidCreate, t.TempDir(), nil) // no file yet
	if err := Arm(file, KeeperMidCreate, 0); err != nil {
		t.Fatal(err)
	}
	Hit(KeeperMidCreate, t.TempDir(), nil)
	Hit(MonitorMidAdopt, t.TempDir(), nil)
}
