package ocicli

import "context"

// Features returns what `features` prints (OCI runtime-spec
// features.md) as JSON, run with the handler's root and options like
// every other call. Runtimes too old to have the subcommand (runc before
// 1.1, crun before 1.8.6) fail here.
func (r *Runtime) Features(ctx context.Context) ([]byte, error) {
	return output(ctx, &Cmd{Args: r.args(nil, "features")}, r.call)
}

// Version returns what `--version` prints: the binary's alone, so it
// takes no state root and creates none.
func (r *Runtime) Version(ctx context.Context) ([]byte, error) {
	return output(ctx, &Cmd{Args: []string{r.Binary, "--version"}}, r.run)
}
