//go:build tools

// Package etcd only pins the etcd that make e2e-cluster runs its control
// plane on (hack/k8s-bins.sh builds it); a module of its own, as etcd's
// modules carry replace directives of their own.
package etcd

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
