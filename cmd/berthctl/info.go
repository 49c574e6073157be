package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// infoCommand prints what berthd reports about itself, all through CRI:
// version, effective config, runtime handlers and their features, counts of
// pods, containers and images, and the streaming and metrics addresses.
func infoCommand(ctx context.Context, g *globals, args []string) error {
	if len(args) != 0 {
		return errUsage
	}
	conn, err := g.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rt := criapi.NewRuntimeServiceClient(conn)
	img := criapi.NewImageServiceClient(conn)

	v, err := rt.Version(ctx, &criapi.VersionRequest{})
	if err != nil {
		return fmt.Errorf("version: %w", err)
	}
	st, err := rt.Status(ctx, &criapi.StatusRequest{Verbose: true})
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	fmt.Fprintf(g.stdout, "runtime:    %s %s (CRI %s)\n", v.RuntimeName, v.RuntimeVersion, v.RuntimeApiVersion)
	fmt.Fprintf(g.stdout, "endpoint:   %s\n", g.address)
	fmt.Fprintf(g.stdout, "streaming:  %s\n", orNone(st.Info["streamingAddress"]))
	fmt.Fprintf(g.stdout, "metrics:    %s\n", orNone(st.Info["metricsAddress"]))
	if d := st.Info["cgroupDriver"]; d != "" {
		fmt.Fprintf(g.stdout, "cgroups:    %s driver\n", d)
	}
	printControllers(g, st.Info["cgroupControllers"])
	for _, c := range st.GetStatus().GetConditions() {
		line := fmt.Sprintf("%s=%v", c.Type, c.Status)
		if !c.Status {
			line += fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
		}
		fmt.Fprintf(g.stdout, "condition:  %s\n", line)
	}
	for _, h := range st.GetRuntimeHandlers() {
		name := h.GetName()
		if name == "" {
			name = "(default)"
		}
		fmt.Fprintf(g.stdout, "handler:    %s recursive_read_only_mounts=%v user_namespaces=%v\n",
			name, h.GetFeatures().GetRecursiveReadOnlyMounts(), h.GetFeatures().GetUserNamespaces())
	}

	counts := map[string]int{}
	if pods, err := rt.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{}); err == nil {
		for _, p := range pods.Items {
			counts["pods "+stateName(p.State.String())]++
		}
		counts["pods"] = len(pods.Items)
	} else {
		fmt.Fprintf(g.stdout, "pods:       unavailable (%v)\n", err)
	}
	if ctrs, err := rt.ListContainers(ctx, &criapi.ListContainersRequest{}); err == nil {
		for _, c := range ctrs.Containers {
			counts["containers "+stateName(c.State.String())]++
		}
		counts["containers"] = len(ctrs.Containers)
	} else {
		fmt.Fprintf(g.stdout, "containers: unavailable (%v)\n", err)
	}
	if imgs, err := img.ListImages(ctx, &criapi.ListImagesRequest{}); err == nil {
		counts["images"] = len(imgs.Images)
	} else {
		fmt.Fprintf(g.stdout, "images:     unavailable (%v)\n", err)
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(g.stdout, "%-22s %d\n", k+":", counts[k])
	}

	var cfg any
	if err := json.Unmarshal([]byte(st.Info["config"]), &cfg); err == nil {
		pretty, _ := json.MarshalIndent(cfg, "", "  ")
		fmt.Fprintf(g.stdout, "config:\n%s\n", pretty)
	}
	return nil
}

// printControllers shows the cgroup controllers berthd detected at start
// and the limits it drops for the missing ones.
func printControllers(g *globals, raw string) {
	var c struct {
		Version         string   `json:"version"`
		Available       []string `json:"available"`
		MissingRequired []string `json:"missingRequired"`
		MissingOptional []struct {
			Controller string `json:"controller"`
			Dropped    string `json:"dropped"`
		} `json:"missingOptional"`
	}
	if raw == "" || json.Unmarshal([]byte(raw), &c) != nil {
		return
	}
	fmt.Fprintf(g.stdout, "controllers: %s: %s\n", c.Version, strings.Join(c.Available, " "))
	for _, m := range c.MissingRequired {
		fmt.Fprintf(g.stdout, "missing:    %s (required: containers fail)\n", m)
	}
	for _, m := range c.MissingOptional {
		fmt.Fprintf(g.stdout, "missing:    %s (%s dropped)\n", m.Controller, m.Dropped)
	}
}

func orNone(s string) string {
	if s == "" {
		return "off"
	}
	return s
}

// stateName turns SANDBOX_READY / CONTAINER_RUNNING into ready / running.
func stateName(s string) string {
	s = strings.TrimPrefix(strings.TrimPrefix(s, "SANDBOX_"), "CONTAINER_")
	return strings.ToLower(s)
}
