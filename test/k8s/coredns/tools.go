//go:build tools

// Package coredns only pins the CoreDNS that make e2e-cluster runs as the
// cluster DNS (hack/k8s-bins.sh builds it); a module of its own.
package coredns

import (
	_ "github.com/coredns/coredns"
)
