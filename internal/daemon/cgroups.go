package daemon

import (
	"fmt"
	"log/slog"

	"github.com/berthcri/berth/internal/cgroupctrl"
	"github.com/berthcri/berth/internal/config"
)

// detectCgroups finds the cgroup controllers the runtime can use for pods
// under berth's default parent and says once, at start, which limits are
// dropped from every container because a controller is missing (not per
// container: the kubelet sends hugepage limits for every container).
func detectCgroups(cfg *config.Config, log *slog.Logger) (*cgroupctrl.Controllers, error) {
	parent, err := cgroupctrl.PodParent(cfg.CgroupDriver, cfg.CgroupParent)
	if err != nil {
		return nil, err
	}
	if cfg.CgroupDriver == config.CgroupDriverCgroupfs {
		if c, err := cgroupctrl.Detect(cgroupctrl.Options{}); err == nil && c.V2 {
			// berthd and runc enable the root's controllers down to every
			// pod; do it for the default parent now so the controllers
			// read below are those pods get (docs/cgroups.md).
			if err := cgroupctrl.EnableDown(cgroupctrl.DefaultRoot, parent); err != nil {
				log.Warn("enable cgroup controllers down to the pod parent", "parent", parent, "err", err)
			}
		}
	}
	c, err := cgroupctrl.Detect(cgroupctrl.Options{Parent: parent})
	if err != nil {
		return nil, fmt.Errorf("detect cgroup controllers: %w", err)
	}
	log.Info("cgroup controllers", "cgroup", c.Version(), "available", c.Available, "source", c.Source)
	if m := c.MissingRequired(); len(m) > 0 {
		log.Warn("required cgroup controllers are missing: containers will fail to start", "missing", m)
	}
	if m := c.MissingOptional(); len(m) > 0 {
		var names, dropped []string
		for _, x := range m {
			names = append(names, x.Controller)
			dropped = append(dropped, x.Dropped)
		}
		log.Warn("cgroup controllers missing: their limits are dropped from every container",
			"missing", names, "dropped", dropped)
	}
	return c, nil
}
