package main

import (
	"context"
	"fmt"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/doctor"
)

// doctorCommand checks the node against the berthd config at --config
// (absent file: defaults) and exits non-zero when any check fails.
func doctorCommand(ctx context.Context, g *globals, args []string) error {
	if len(args) != 0 {
		return errUsage
	}
	cfg := config.Default()
	if err := config.LoadFile(cfg, g.configPath); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("config %s: %w", g.configPath, err)
	}
	results := doctor.Run(ctx, cfg)
	doctor.Print(g.stdout, results)
	if doctor.Failed(results) {
		fmt.Fprintln(g.stdout, "\nberthd will not work on this node until the failures above are fixed.")
		return errFailed
	}
	return nil
}
