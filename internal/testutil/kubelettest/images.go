package kubelettest

// RegistryHost is the registry the kubelet-driven tests' pods name:
// berthd's hosts.toml mirrors it to the test's in-process registry over
// plain HTTP (nothing answers for the name itself).
const RegistryHost = "registry.berth.test"

// Images the kubelet-driven tests' pods use, as the kubelet asks for them.
const (
	BusyboxImage = RegistryHost + "/busybox:1.36"
	HTTPDImage   = RegistryHost + "/busybox-httpd:1.0"
)
