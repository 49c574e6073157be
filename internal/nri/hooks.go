package nri

import (
	"context"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/berthcri/berth/internal/container"
	// Under another name: this package's own lifecycle type is how far
	// plugins were told an object got.
	domain "github.com/berthcri/berth/internal/lifecycle"
	"github.com/berthcri/berth/internal/sandbox"
)

// Hooks is n as the lifecycle service's hooks (lifecycle.Options.Hooks):
// every flow of a pod or container tells NRI through it. A nil or
// disabled n makes hooks that tell nobody.
func (n *NRI) Hooks() domain.Hooks { return hooks{n} }

// hooks hands the plugin-sync blocks over as the functions that release
// them; every other method is NRI's own.
type hooks struct{ *NRI }

func (h hooks) RunPodSandbox(ctx context.Context, sb *sandbox.Sandbox) (func(), error) {
	b, err := h.NRI.RunPodSandbox(ctx, sb)
	return unblocker(b), err
}

func (h hooks) CreateContainer(ctx context.Context, sb *sandbox.Sandbox, c *container.Container, spec *specs.Spec) (func(), error) {
	b, err := h.NRI.CreateContainer(ctx, sb, c, spec)
	return unblocker(b), err
}

// unblocker is b's Unblock; nil when nothing is held.
func unblocker(b *SyncBlock) func() {
	if b == nil {
		return nil
	}
	return b.Unblock
}
