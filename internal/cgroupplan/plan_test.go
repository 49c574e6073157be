package cgroupplan

import (
	"slices"
	"strings"
	"testing"
)

const (
	podID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ctr1  = "1111111111111111111111111111111111111111111111111111111111111111"
	ctr2  = "2222222222222222222222222222222222222222222222222222222222222222"
)

var v2Controllers = []string{"cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"}

func TestPodPlansFollowTheV2Rules(t *testing.T) {
	for _, v2 := range []bool{false, true} {
		for _, sd := range []bool{false, true} {
			for _, holder := range []bool{false, true} {
				in := Input{V2: v2, Systemd: sd, PodID: podID, Holder: holder, Containers: []string{ctr1, ctr2}}
				in.Pod = "/berth/pod-" + podID
				if sd {
					in.Pod = "/berth.slice/berth-berthpod_" + podID + ".slice"
				}
				if v2 {
					in.Controllers = v2Controllers
				}
				name := map[bool]string{false: "v1", true: "v2"}[v2] + "/" + map[bool]string{false: "cgroupfs", true: "systemd"}[sd] + "/" + map[bool]string{false: "no-holder", true: "holder"}[holder]
				t.Run(name, func(t *testing.T) {
					p := Pod(in)
					// The rules are checked on v1 plans too: the layout is
					// the same everywhere.
					p2 := p
					p2.V2 = true
					if err := p2.Check(); err != nil {
						t.Fatalf("plan breaks the v2 rules: %v\n%s", err, p)
					}
					h, ok := p.Holder()
					if ok != holder {
						t.Fatalf("holder cgroup: %v, want %v\n%s", ok, holder, p)
					}
					if holder {
						want := in.Pod + "/berth-pause"
						if sd {
							want = in.Pod + "/berth-pause-" + podID + ".scope"
						}
						if h.Path != want || h.Path == in.Pod {
							t.Errorf("holder in %s, want %s", h.Path, want)
						}
					}
					for _, c := range p.Cgroups {
						if c.Path == in.Pod && len(c.Procs) > 0 {
							t.Errorf("the pod cgroup holds %v", c.Procs)
						}
						if strings.HasSuffix(c.Path, "/"+ctr1) || strings.HasSuffix(c.Path, "berth-"+ctr1+".scope") {
							if c.MadeBy != Runtime {
								t.Errorf("container cgroup %s made by %s", c.Path, c.MadeBy)
							}
						}
					}
					made := p.Made()
					switch {
					case sd && len(made) > 0:
						t.Errorf("berth makes %v under systemd", made)
					case !sd && (len(made) == 0 || made[0].Path != in.Pod):
						t.Errorf("berth makes %v, want the pod cgroup first", made)
					}
					for _, c := range p.Cgroups {
						var want []string
						if v2 && !sd && (c.MadeBy == Host || c.Path == in.Pod) {
							want = v2Controllers
						}
						if !slices.Equal(c.Enable, want) {
							t.Errorf("%s enables %v, want %v", c.Path, c.Enable, want)
						}
					}
				})
			}
		}
	}
}

func TestPlanUnderAKubeletParent(t *testing.T) {
	p := Pod(Input{V2: true, PodID: podID, Pod: "/kubepods/burstable/podabc/pod-" + podID, Holder: true, Controllers: []string{"cpu", "memory"}})
	var paths []string
	for _, c := range p.Cgroups {
		paths = append(paths, c.Path)
	}
	want := []string{"/", "/kubepods", "/kubepods/burstable", "/kubepods/burstable/podabc", "/kubepods/burstable/podabc/pod-" + podID, "/kubepods/burstable/podabc/pod-" + podID + "/berth-pause"}
	if !slices.Equal(paths, want) {
		t.Fatalf("cgroups %v, want %v", paths, want)
	}
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
}

// A holder in the pod cgroup, containers below it: what cgroup v2's
// no-internal-process rule forbids (decision 2200). Check must catch it.
func TestCheckCatchesAHolderInThePodCgroup(t *testing.T) {
	pod := "/berth/pod-" + podID
	all := []string{"cpu", "memory", "pids"}
	p := Plan{V2: true, Cgroups: []Cgroup{
		{Path: "/", MadeBy: Host, Enable: all},
		{Path: "/berth", MadeBy: Host, Enable: all},
		{Path: pod, MadeBy: Berth, Procs: []string{"berth-pause"}, Enable: all},
		{Path: pod + "/" + ctr1, MadeBy: Runtime, Procs: []string{"container " + ctr1}},
	}}
	err := p.Check()
	if err == nil {
		t.Fatalf("no error for\n%s", p)
	}
	for _, want := range []string{pod + " holds berth-pause and enables cpu memory pids", pod + " holds berth-pause and has the child " + pod + "/" + ctr1} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	p.V2 = false
	if err := p.Check(); err != nil {
		t.Errorf("v1 has no such rule: %v", err)
	}
}

func TestCheckCatchesAControllerMissingUpTheTree(t *testing.T) {
	p := Plan{V2: true, Cgroups: []Cgroup{
		{Path: "/", MadeBy: Host, Enable: []string{"cpu"}},
		{Path: "/berth", MadeBy: Host, Enable: []string{"cpu", "memory"}},
		{Path: "/berth/pod-x", MadeBy: Berth, Enable: []string{"cpu", "memory"}},
		{Path: "/berth/pod-x/" + ctr1, MadeBy: Runtime, Procs: []string{"container"}},
	}}
	err := p.Check()
	if err == nil || !strings.Contains(err.Error(), "/berth/pod-x enables memory but its ancestor / does not") {
		t.Fatalf("got %v", err)
	}
}

func TestHolderNameCannotBeAContainerID(t *testing.T) {
	for _, r := range HolderName {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return
		}
	}
	t.Fatalf("%q could be a container ID", HolderName)
}

func TestDomainControllers(t *testing.T) {
	for c, want := range map[string]bool{"memory": true, "io": true, "hugetlb": true, "cpu": false, "pids": false, "cpuset": false} {
		if Domain(c) != want {
			t.Errorf("Domain(%s) = %v", c, !want)
		}
	}
}
