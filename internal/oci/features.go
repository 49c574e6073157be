package oci

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
)

// Features is the part of `runtime features` (OCI runtime-spec
// features.md) berth reads.
type Features struct {
	MountOptions []string `json:"mountOptions"`
	Linux        *struct {
		Namespaces []string `json:"namespaces"`
	} `json:"linux"`
}

// UserNamespaces reports whether the runtime can put a container in a
// user namespace ("user" among linux.namespaces).
func (f *Features) UserNamespaces() bool {
	return f != nil && f.Linux != nil && slices.Contains(f.Linux.Namespaces, "user")
}

// RecursiveReadOnly reports whether the runtime understands the "rro"
// mount option (runc ≥ 1.1 on a kernel with mount_setattr).
func (f *Features) RecursiveReadOnly() bool {
	return f != nil && slices.Contains(f.MountOptions, "rro")
}

// Features runs `features` with the handler's root and options and
// parses its JSON. Runtimes too old to have the subcommand fail here;
// callers treat that as "no features".
func (r *Runtime) Features(ctx context.Context) (*Features, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	out, err := r.CLI().Features(ctx)
	if err != nil {
		return nil, err
	}
	var f Features
	if err := json.Unmarshal(out, &f); err != nil {
		return nil, fmt.Errorf("parse %s features: %w", r.Binary, err)
	}
	return &f, nil
}
