// nri-recorder is a pre-installed NRI plugin for berth's integration
// tests: berthd starts it from nri.plugin_path; it appends one line per
// pod event to the file its configuration (from nri.plugin_config_path)
// names.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	api "github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type recorder struct{ out string }

func (r *recorder) Configure(_ context.Context, config, runtime, _ string) (api.EventMask, error) {
	r.out = strings.TrimSpace(config)
	return 0, r.write("Configure " + runtime)
}

func (r *recorder) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return r.write("RunPodSandbox " + pod.GetName())
}

func (r *recorder) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return r.write("RemovePodSandbox " + pod.GetName())
}

func (r *recorder) write(line string) error {
	f, err := os.OpenFile(r.out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintln(f, line)
	return err
}

func main() {
	s, err := stub.New(&recorder{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
