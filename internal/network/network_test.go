package network

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newTestNetwork(t *testing.T, binDirs []string) (*Network, string) {
	dir := t.TempDir()
	return New(Options{ConfDir: filepath.Join(dir, "net.d"), BinDirs: binDirs, Bridge: "btest0", Subnet: "10.99.0.0/24", IPAMDataDir: filepath.Join(dir, "ipam")}), filepath.Join(dir, "net.d")
}

func TestEmbeddedDefaultNetworkWhenConfDirEmpty(t *testing.T) {
	n, _ := newTestNetwork(t, nil)
	list, file, err := n.Config()
	if err != nil || file != "" {
		t.Fatalf("Config: %v %q", err, file)
	}
	if list.Name != "berth" || len(list.Plugins) != 2 || list.Plugins[0].Network.Type != "bridge" || list.Plugins[1].Network.Type != "portmap" {
		t.Fatalf("default network: %s", list.Bytes)
	}
	var bridge struct {
		Bridge string `json:"bridge"`
		IPMasq bool   `json:"ipMasq"`
		IPAM   struct {
			DataDir string `json:"dataDir"`
			Ranges  [][]struct {
				Subnet string `json:"subnet"`
			} `json:"ranges"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(list.Plugins[0].Bytes, &bridge); err != nil {
		t.Fatal(err)
	}
	// Masqueraded by the node-level rule, not per pod (decision 1601).
	if bridge.Bridge != "btest0" || bridge.IPMasq || bridge.IPAM.Ranges[0][0].Subnet != "10.99.0.0/24" || !strings.HasSuffix(bridge.IPAM.DataDir, "ipam") {
		t.Fatalf("default bridge config does not follow the options: %+v", bridge)
	}
}

func TestConfDirFirstFileWinsAndReloads(t *testing.T) {
	n, confDir := newTestNetwork(t, nil)
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(confDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("20-b.conflist", `{"cniVersion":"1.0.0","name":"b","plugins":[{"type":"bridge"}]}`)
	write("10-a.conf", `{"cniVersion":"0.4.0","name":"a","type":"ptp"}`)
	list, file, err := n.Config()
	if err != nil || list.Name != "a" || !strings.HasSuffix(file, "10-a.conf") || list.Plugins[0].Network.Type != "ptp" {
		t.Fatalf("first config: %v %q %+v", err, file, list)
	}
	if err := os.Remove(filepath.Join(confDir, "10-a.conf")); err != nil {
		t.Fatal(err)
	}
	list, _, err = n.Config()
	if err != nil || list.Name != "b" {
		t.Fatalf("after removing the first file: %v %+v", err, list)
	}
	// An in-place edit changes the file's mtime, not the directory's.
	time.Sleep(10 * time.Millisecond)
	write("20-b.conflist", `{"cniVersion":"1.0.0","name":"b2","plugins":[{"type":"bridge"}]}`)
	if list, _, err = n.Config(); err != nil || list.Name != "b2" {
		t.Fatalf("after editing: %v %+v", err, list)
	}
	write("00-broken.conflist", `{"name":`)
	if _, _, err := n.Config(); err == nil {
		t.Fatal("broken first config accepted")
	}
	if err := n.Ready(); err == nil {
		t.Fatal("Ready with a broken config")
	}
}

func TestReadyNamesTheMissingPlugin(t *testing.T) {
	bin := t.TempDir()
	n, _ := newTestNetwork(t, []string{bin})
	err := n.Ready()
	if err == nil || !strings.Contains(err.Error(), `"bridge"`) {
		t.Fatalf("Ready without plugins: %v", err)
	}
	for _, p := range []string{"bridge", "portmap"} {
		if err := os.WriteFile(filepath.Join(bin, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Ready(); err != nil {
		t.Fatalf("Ready with plugins installed: %v", err)
	}
}

func TestPrepareTrimsTheEmbeddedNetworkPerPod(t *testing.T) {
	n, confDir := newTestNetwork(t, nil)
	// As if the node-level masquerade were installed (the test must not
	// touch the host's iptables).
	n.masqOnce.Do(func() {})
	plugins := func(hostPorts bool) string {
		t.Helper()
		att, err := n.Prepare(hostPorts)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Name    string `json:"name"`
			Plugins []struct {
				Type   string `json:"type"`
				IPMasq bool   `json:"ipMasq"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal(att.ConfList, &list); err != nil {
			t.Fatal(err)
		}
		out := []string{list.Name}
		for _, p := range list.Plugins {
			if p.IPMasq {
				p.Type += "(ipMasq)"
			}
			out = append(out, p.Type)
		}
		return strings.Join(out, ",")
	}
	if got := plugins(false); got != "berth,bridge" {
		t.Errorf("embedded network, no host ports: %s, want berth,bridge", got)
	}
	if got := plugins(true); got != "berth,bridge,portmap" {
		t.Errorf("embedded network, host ports: %s, want berth,bridge,portmap", got)
	}
	// Without the node-level rule the bridge plugin masquerades each pod.
	n.masqErr = errors.New("no iptables")
	if got := plugins(false); got != "berth,bridge(ipMasq)" {
		t.Errorf("embedded network without node masquerade: %s, want berth,bridge(ipMasq)", got)
	}
	// An operator's config runs whole, host ports or not.
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-op.conflist"), []byte(`{"cniVersion":"1.0.0","name":"op","plugins":[{"type":"bridge","ipMasq":true},{"type":"portmap","capabilities":{"portMappings":true}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := plugins(false); got != "op,bridge(ipMasq),portmap" {
		t.Errorf("operator network, no host ports: %s, want op,bridge(ipMasq),portmap", got)
	}
}
