package container

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/berthcri/berth/internal/errdefs"
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
	return spec.Linux.CgroupsPath, nil
}

// UpperDir is the container's writable layer (the overlay upper dir).
func (s *Store) UpperDir(id string) (string, error) {
	e, err := s.entry(id)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.dir(e.rec.ID), "upper"), nil
}
