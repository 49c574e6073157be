package security

import (
	"os"
	"testing"

	"google.golang.org/grpc/codes"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// TestSysctlInjectionIsRefused asks for pod sysctls that smuggle a second,
// node-wide sysctl in, as CVE-2022-0811 ("cr8escape") did to CRI-O through
// '+' and '=' (kernel.core_pattern runs a program as root on the host),
// or climb out of net/ with "..", or are simply not namespaced. Each must
// be refused as InvalidArgument before anything is written, and
// kernel.core_pattern must not change.
func TestSysctlInjectionIsRefused(t *testing.T) {
	d := berthdtest.Start(t, berthdtest.Options{})
	before, err := os.ReadFile("/proc/sys/kernel/core_pattern")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, key, value string }{
		{"plus in value", "net.ipv4.ip_unprivileged_port_start", "0+kernel.core_pattern=|/tmp/berth-pwn %p"},
		{"equals and plus in key", "net.ipv4.ip_forward=1+kernel.core_pattern", "|/tmp/berth-pwn %p"},
		{"newline in value", "net.ipv4.ip_unprivileged_port_start", "0\nkernel.core_pattern=|/tmp/berth-pwn"},
		{"dotdot in slash form", "net/ipv4/../../kernel/core_pattern", "|/tmp/berth-pwn %p"},
		{"dotdot in dotted form", "net.ipv4/../../kernel.core_pattern", "|/tmp/berth-pwn %p"},
		{"not namespaced", "kernel.core_pattern", "|/tmp/berth-pwn %p"},
		{"not namespaced, slash form", "kernel/core_pattern", "|/tmp/berth-pwn %p"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &criapi.PodSandboxConfig{
				Metadata: &criapi.PodSandboxMetadata{Name: "sysctl", Namespace: "security", Uid: "sysctl-uid"},
				Linux: &criapi.LinuxPodSandboxConfig{
					Sysctls: map[string]string{tc.key: tc.value},
					SecurityContext: &criapi.LinuxSandboxSecurityContext{
						NamespaceOptions: &criapi.NamespaceOption{Pid: criapi.NamespaceMode_CONTAINER},
					},
				},
			}
			resp, err := d.Runtime.RunPodSandbox(berthdtest.Ctx(t), &criapi.RunPodSandboxRequest{Config: cfg})
			if err == nil {
				t.Cleanup(func() {
					d.Runtime.StopPodSandbox(berthdtest.Ctx(t), &criapi.StopPodSandboxRequest{PodSandboxId: resp.PodSandboxId})
					d.Runtime.RemovePodSandbox(berthdtest.Ctx(t), &criapi.RemovePodSandboxRequest{PodSandboxId: resp.PodSandboxId})
				})
			}
			if after, _ := os.ReadFile("/proc/sys/kernel/core_pattern"); string(after) != string(before) {
				os.WriteFile("/proc/sys/kernel/core_pattern", before, 0o644)
				t.Fatalf("kernel.core_pattern changed to %q", after)
			}
			berthdtest.WantCode(t, err, codes.InvalidArgument)
		})
	}
}
