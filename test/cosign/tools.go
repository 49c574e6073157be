//go:build tools

// Package tools pins the cosign programs hack/cosign-bins.sh builds.
package tools

import (
	_ "github.com/sigstore/cosign/v2/cmd/cosign"
	_ "github.com/sigstore/cosign/v3/cmd/cosign"
)
