//go:build tools

// Package critest only pins the programs hack/k8s-bins.sh builds from
// cri-tools (critest, and crictl, which make conformance cleans up with);
// the build tag keeps this file out of every build.
package critest

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/cri-tools/cmd/critest"
)
