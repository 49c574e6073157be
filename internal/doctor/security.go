package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/BurntSushi/toml"

	"github.com/berthcri/berth/internal/config"
	"github.com/berthcri/berth/internal/image"
	"github.com/berthcri/berth/internal/sigpolicy"
)

// The checks of an insecure setup (issue 34): they warn, never fail —
// berthd works, but it hands something to the node's other users or to
// the network.

// maxTreeEntries bounds how many entries of one directory the state tree
// check looks at: a node with more containers than that is checked in
// part, and says so.
const maxTreeEntries = 4096

// checkStateTree looks at berthd's root and state directories the way
// decision 3400 closes them: the root and state dirs and the three that
// lead to a container's rootfs or a pod's files (root/containers,
// root/sandboxes, state/sandboxes) may be searched by other users (a user
// namespace pod's root passes through them) but never listed or written;
// every other directory in them, and every container's and pod's own
// directory, is closed to others (0700, or 0710 for the group of a user
// namespace pod's root). Each must be owned by root.
func checkStateTree(cfg *config.Config) Result {
	r := Result{Name: "state tree"}
	traversable := map[string]bool{
		cfg.Root: true, cfg.State: true,
		filepath.Join(cfg.Root, "containers"): true, filepath.Join(cfg.Root, "sandboxes"): true,
		filepath.Join(cfg.State, "sandboxes"): true,
	}
	var problems []string
	partial := false
	check := func(dir string, fi fs.FileInfo, closedMask fs.FileMode) {
		if !fi.IsDir() {
			return
		}
		perm := fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
			problems = append(problems, fmt.Sprintf("%s is owned by uid %d", dir, st.Uid))
		}
		switch {
		case traversable[dir] && perm&0o066 != 0:
			problems = append(problems, fmt.Sprintf("%s is %#o (others may list or write it)", dir, perm))
		case !traversable[dir] && perm&closedMask != 0:
			problems = append(problems, fmt.Sprintf("%s is %#o (others may enter it)", dir, perm))
		}
	}
	// entries checks the directories in dir with closedMask.
	entries := func(dir string, closedMask fs.FileMode) {
		f, err := os.Open(dir)
		if err != nil {
			return
		}
		defer f.Close()
		es, _ := f.ReadDir(maxTreeEntries) // what could be read
		if len(es) == maxTreeEntries {
			partial = true
		}
		for _, e := range es {
			p := filepath.Join(dir, e.Name())
			if fi, err := os.Lstat(p); err == nil {
				check(p, fi, closedMask)
			}
		}
	}
	found := false
	for _, top := range []string{cfg.Root, cfg.State} {
		fi, err := os.Lstat(top)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		found = true
		check(top, fi, 0o077)
		entries(top, 0o077)
	}
	for dir := range traversable {
		if dir != cfg.Root && dir != cfg.State {
			// A user namespace container's or pod's dir is 0710 with the
			// group of its root: only others are checked.
			entries(dir, 0o007)
		}
	}
	switch {
	case len(problems) > 0:
		sort.Strings(problems)
		n := len(problems)
		if n > 5 {
			problems = append(problems[:5], fmt.Sprintf("and %d more", n-5))
		}
		r.Level = Warn
		r.Message = "open to other host users, who could reach containers' files and run setuid programs they wrote (CVE-2021-41103): " + strings.Join(problems, "; ")
		r.Hint = "restart berthd, which closes its tree at start (decision 3400), or chmod o-rwx the directories named"
	case !found:
		r.Level, r.Message = OK, fmt.Sprintf("%s and %s will be created closed to other users", cfg.Root, cfg.State)
	default:
		r.Level, r.Message = OK, fmt.Sprintf("%s and %s are closed to other users", cfg.Root, cfg.State)
	}
	if partial {
		r.Message += fmt.Sprintf(" (only the first %d entries of a directory were checked)", maxTreeEntries)
	}
	return r
}

// checkStreaming warns when the streaming server is reachable beyond
// this host without TLS.
func checkStreaming(cfg *config.Config) Result {
	r := Result{Name: "streaming"}
	switch {
	case cfg.StreamingInsecure():
		r.Level = Warn
		r.Message = fmt.Sprintf("streaming_address %s listens beyond loopback without TLS: anyone who reaches it with a URL's token gets exec, attach and port-forward", cfg.StreamingAddress)
		r.Hint = "listen on 127.0.0.1 (the kubelet proxies streams), or set streaming_tls_cert and streaming_tls_key"
	case cfg.StreamingTLSCert != "":
		r.Level, r.Message = OK, fmt.Sprintf("%s over TLS", cfg.StreamingAddress)
	default:
		r.Level, r.Message = OK, fmt.Sprintf("%s (loopback only)", cfg.StreamingAddress)
	}
	return r
}

// checkMirrorPolicy warns when a registry has mirrors in the registry
// config dir (certs.d) while the signature policy accepts its images
// unsigned: a mirror can then serve any image under the registry's name.
func checkMirrorPolicy(cfg *config.Config) Result {
	r := Result{Name: "signature policy"}
	pol, err := sigpolicy.Load(cfg.SignaturePolicy)
	if err != nil {
		r.Level, r.Message = Fail, err.Error()
		r.Hint = "fix the policy file: berthd refuses to start with it"
		return r
	}
	mirrored, err := mirroredRegistries(cfg.RegistryConfigDir)
	if err != nil {
		r.Level, r.Message = Warn, err.Error()
		r.Hint = "fix the registry config: pulls from that registry fail"
		return r
	}
	var open []string
	for _, reg := range mirrored {
		ref := image.Named{Domain: reg, Path: "any/image"}
		if reg == "_default" {
			ref = image.Named{} // the policy's defaults
		}
		if pol.AcceptsUnsigned(ref) {
			open = append(open, fmt.Sprintf("%s (%s)", reg, pol.ScopeOf(ref)))
		}
	}
	policy := "no policy file"
	if pol != nil {
		policy = pol.Path
	}
	switch {
	case len(open) > 0:
		r.Level = Warn
		r.Message = fmt.Sprintf("registries with mirrors in %s are accepted unsigned by %s: %s", cfg.RegistryConfigDir, policy, strings.Join(open, ", "))
		r.Hint = "a mirror can serve any image under the registry's name; require sigstoreSigned for those registries in the policy (docs/signature-policy.md)"
	case len(mirrored) > 0:
		r.Level, r.Message = OK, fmt.Sprintf("mirrored registries (%s) require signatures", strings.Join(mirrored, ", "))
	case pol == nil:
		r.Level, r.Message = OK, "no policy file: every image is accepted (no registry has mirrors)"
	default:
		r.Level, r.Message = OK, "using "+pol.Path
	}
	return r
}

// mirroredRegistries lists the registries (directory names, "_default"
// for all) whose hosts.toml names at least one [host."…"] mirror.
func mirroredRegistries(dir string) ([]string, error) {
	if dir == "" {
		return nil, nil
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*", "hosts.toml"))
	var out []string
	for _, f := range files {
		var hf struct {
			Host map[string]toml.Primitive `toml:"host"`
		}
		if _, err := toml.DecodeFile(f, &hf); err != nil {
			return nil, fmt.Errorf("registry config %s: %w", f, err)
		}
		if len(hf.Host) > 0 {
			out = append(out, registryOfDir(filepath.Base(filepath.Dir(f))))
		}
	}
	sort.Strings(out)
	return out, nil
}

// registryOfDir undoes containerd's "host_port_" directory spelling.
func registryOfDir(name string) string {
	if strings.HasSuffix(name, "_") && strings.Count(name, "_") >= 2 {
		trimmed := strings.TrimSuffix(name, "_")
		if i := strings.LastIndex(trimmed, "_"); i > 0 {
			return trimmed[:i] + ":" + trimmed[i+1:]
		}
	}
	return name
}
