package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/berthcri/berth/internal/admin"
)

// printRunningConfig asks the berthd serving listen for the configuration
// in effect (its start-up configuration with what its reloads applied) and
// prints it as TOML, after comment lines saying what its last reload did:
// fed back with --config, it gives the same configuration.
func printRunningConfig(listen string, w io.Writer) error {
	conn, err := grpc.NewClient(listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to berthd at %s: %w", listen, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := admin.Config(ctx, conn)
	if err != nil {
		return fmt.Errorf("ask berthd at %s for its configuration: %w", listen, err)
	}
	m := res.AsMap()
	fmt.Fprintf(w, "# configuration in effect in the berthd at %s (generation %v)\n", listen, m["generation"])
	if sp, ok := m["signaturePolicy"].(map[string]any); ok {
		if d, _ := sp["digest"].(string); d != "" {
			fmt.Fprintf(w, "# signature policy: %v (%s), scopes %v\n", sp["path"], d, sp["scopes"])
		} else {
			fmt.Fprintf(w, "# signature policy: none at %v, every image is accepted\n", sp["path"])
		}
	}
	if r, ok := m["reloads"].(map[string]any); ok {
		fmt.Fprintf(w, "# reloads (SIGHUP): %v success, %v partial, %v failure\n", r["success"], r["partial"], r["failure"])
	}
	if last, ok := m["lastReload"].(map[string]any); ok {
		fmt.Fprintf(w, "# last reload: %v at %v\n", last["result"], last["at"])
		if e, _ := last["error"].(string); e != "" {
			fmt.Fprintf(w, "#   refused: %s\n", oneLine(e))
		}
		changes, _ := last["changes"].([]any)
		for _, c := range changes {
			c, _ := c.(map[string]any)
			if applied, _ := c["applied"].(bool); applied {
				fmt.Fprintf(w, "#   applied %v: %v -> %v\n", c["key"], c["old"], c["new"])
			} else {
				fmt.Fprintf(w, "#   not applied %v (file: %v): %v\n", c["key"], c["new"], c["reason"])
			}
		}
	}
	text, _ := m["toml"].(string)
	_, err = io.WriteString(w, text)
	return err
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }
