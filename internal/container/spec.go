package container

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Spec returns the OCI spec the container was created with (its bundle's
// config.json, with any NRI adjustments).
func (s *Store) Spec(id string) (*specs.Spec, error) {
	e, err := s.entry(id)
	if err != nil {
		return nil, err
	}
	return readSpec(s.dir(e.Published().ID)) // never waits on a busy container
}

// readSpec reads the bundle's config.json in a container's directory.
func readSpec(dir string) (*specs.Spec, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read spec of %s: %w", filepath.Base(dir), err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return &spec, nil
}
