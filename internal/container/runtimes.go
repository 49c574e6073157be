package container

import "github.com/berthcri/berth/internal/oci"

// runtime finds the OCI runtime of a runtime handler. The handler table
// itself is built from the configuration by liveconfig.Runtimes.
func (s *Store) runtime(handler string) (*oci.Runtime, bool) {
	if s.opts.RuntimeFor != nil {
		return s.opts.RuntimeFor(handler)
	}
	rt, ok := s.opts.Runtimes[handler]
	return rt, ok
}
