package container

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/berthcri/berth/internal/errdefs"
	"github.com/berthcri/berth/internal/stats"
)

// CgroupsPath is the container's linux.cgroupsPath from its bundle's
// config.json: a cgroupfs path or systemd's slice:prefix:name.
func (s *Store) CgroupsPath(id string) (string, error) {
	e, err := s.entry(id)
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(s.dir(e.rec.ID), "config.json"))
	if err != nil {
		if os.IsNotExist(err) {
			return "", fmt.Errorf("bundle of container %s: %w", e.rec.ID, errdefs.ErrNotFound)
		}
		return "", fmt.Errorf("read bundle of container %s: %w", e.rec.ID, err)
	}
	var spec struct {
		Linux *struct {
			CgroupsPath string `json:"cgroupsPath"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", fmt.Errorf("parse bundle of container %s: %w", e.rec.ID, err)
	}
	if spec.Linux == nil || spec.Linux.CgroupsPath == "" {
		return "", fmt.Errorf("container %s has no cgroups path: %w", e.rec.ID, errdefs.ErrNotFound)
	}
	p := spec.Linux.CgroupsPath
	// systemd's "slice:prefix:name" names a scope, not a place: while the
	// container runs, its init's /proc/<pid>/cgroup says where systemd put
	// it (below its own root when systemd runs in a container).
	if strings.Count(p, ":") == 2 {
		if snap := e.Published(); snap != nil && snap.State == StateRunning && snap.Pid > 0 {
			// The scope's name guards against a reused pid.
			parts := strings.Split(p, ":")
			if group, err := stats.ProcessGroup("/proc", snap.Pid); err == nil && path.Base(group) == parts[1]+"-"+parts[2]+".scope" {
				return group, nil
			}
		}
	}
	return p, nil
}

// UpperDir is the container's writable layer (the overlay upper dir).
func (s *Store) UpperDir(id string) (string, error) {
	e, err := s.entry(id)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.dir(e.rec.ID), "upper"), nil
}
