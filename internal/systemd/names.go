package systemd

import (
	"fmt"
	"path"
	"strings"

	"github.com/berthcri/berth/internal/errdefs"
)

// PodSlicePrefix starts the last dash-separated part of every pod slice
// berth makes: <parent>-berthpod_<id>.slice. The underscore keeps the ID
// one level deep (a dash would start a child slice).
const PodSlicePrefix = "berthpod_"

// ScopePrefix is what runc puts before a container ID in its scope name
// (cgroupsPath "<slice>:berth:<id>" → berth-<id>.scope).
const ScopePrefix = "berth"

// ParentSlice turns a configured or kubelet-given cgroup parent into a
// slice unit name: "kubepods-burstable-pod1.slice" stays as it is; a bare
// name such as berth's default "berth" becomes "berth.slice"; the path of
// a slice as the kubelet's systemd driver sends it,
// "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"
// (the slice's place in the hierarchy), is that slice's name. Any other
// path, a cgroupfs one ("/kubepods/pod1"), is refused: the kubelet and
// berth disagree about the driver.
func ParentSlice(parent string) (string, error) {
	if parent == "" {
		return "", fmt.Errorf("empty cgroup parent: %w", errdefs.ErrInvalidArgument)
	}
	if base := path.Base(parent); strings.Contains(parent, "/") && strings.HasSuffix(base, ".slice") &&
		validSlice(base) == nil && expandSlice(base) == strings.TrimSuffix(parent, "/") {
		parent = base
	}
	if strings.Contains(parent, "/") {
		return "", fmt.Errorf("cgroup parent %q is a cgroupfs path but berth uses the systemd cgroup driver (set the kubelet's cgroupDriver to systemd): %w", parent, errdefs.ErrInvalidArgument)
	}
	slice := parent
	if !strings.HasSuffix(slice, ".slice") {
		slice += ".slice"
	}
	if err := validSlice(slice); err != nil {
		return "", err
	}
	return slice, nil
}

// expandSlice is the cgroup path of a (valid) slice unit below the root:
// a-b.slice → /a.slice/a-b.slice; -.slice → /.
func expandSlice(slice string) string {
	name := strings.TrimSuffix(slice, ".slice")
	if name == "-" {
		return "/"
	}
	var out strings.Builder
	prefix := ""
	for _, part := range strings.Split(name, "-") {
		prefix += part
		out.WriteString("/" + prefix + ".slice")
		prefix += "-"
	}
	return out.String()
}

// validSlice checks a slice unit name: dash-separated non-empty parts of
// the characters systemd allows in unit names.
func validSlice(slice string) error {
	name := strings.TrimSuffix(slice, ".slice")
	bad := name == "" || len(slice) > 255 || strings.HasPrefix(name, "-") || strings.HasSuffix(name, "-") || strings.Contains(name, "--")
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(":-_.\\", c)) {
			bad = true
		}
	}
	if bad && slice != "-.slice" {
		return fmt.Errorf("cgroup parent %q is not a valid systemd slice name: %w", slice, errdefs.ErrInvalidArgument)
	}
	return nil
}

// PodSlice names pod id's own slice below parent (a slice name, see
// ParentSlice): kubepods-burstable-pod1.slice → kubepods-burstable-pod1-berthpod_<id>.slice.
func PodSlice(parent, id string) (string, error) {
	if id == "" || strings.ContainsAny(id, "-/\\.") {
		return "", fmt.Errorf("pod ID %q cannot name a slice: %w", id, errdefs.ErrInvalidArgument)
	}
	p, err := ParentSlice(parent)
	if err != nil {
		return "", err
	}
	name := PodSlicePrefix + id + ".slice"
	if p != "-.slice" {
		name = strings.TrimSuffix(p, ".slice") + "-" + name
	}
	if err := validSlice(name); err != nil {
		return "", err
	}
	return name, nil
}

// PodFromSlice returns the pod ID of a slice PodSlice named below parent
// (a slice name), and false for any other unit.
func PodFromSlice(parent, unit string) (string, bool) {
	prefix := strings.TrimSuffix(parent, ".slice") + "-" + PodSlicePrefix
	if parent == "-.slice" {
		prefix = PodSlicePrefix
	}
	id, ok := strings.CutPrefix(unit, prefix)
	if !ok {
		return "", false
	}
	id, ok = strings.CutSuffix(id, ".slice")
	if !ok || id == "" || strings.Contains(id, "-") {
		return "", false
	}
	return id, true
}

// ExpandSlice is the cgroup path systemd gives a slice when it runs at
// the root of the hierarchy: "a-b-c.slice" → "/a.slice/a-b.slice/a-b-c.slice".
// Prefer Units.ControlGroup, which also holds when systemd itself runs in
// a container below the root.
func ExpandSlice(slice string) (string, error) {
	if slice == "-.slice" {
		return "/", nil
	}
	if err := validSlice(slice); err != nil {
		return "", err
	}
	var p, prefix string
	for _, part := range strings.Split(strings.TrimSuffix(slice, ".slice"), "-") {
		prefix += part
		p = path.Join(p, prefix+".slice")
		prefix += "-"
	}
	return "/" + p, nil
}
