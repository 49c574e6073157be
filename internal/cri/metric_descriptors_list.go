package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Label keys as cAdvisor (and containerd) name them; pod-level metrics
// leave container and image empty.
var (
	metricLabelKeys        = []string{"pod", "namespace", "container", "id", "image"}
	networkMetricLabelKeys = withKeys(metricLabelKeys, "interface")
	fsMetricLabelKeys      = withKeys(metricLabelKeys, "device")
	blkioMetricLabelKeys   = withKeys(fsMetricLabelKeys, "major", "minor", "operation")
	failureMetricLabelKeys = withKeys(metricLabelKeys, "failure_type", "scope")
)

func withKeys(base []string, extra ...string) []string {
	return append(append([]string(nil), base...), extra...)
}

// metricDescriptors are the cAdvisor metrics ListPodSandboxMetrics fills,
// for the kubelet's /metrics/cadvisor. Every one listed here is sent for
// every running container (network ones for every pod with its own
// network namespace), except the block I/O ones, sent per device the
// container did I/O on, and the pressure ones, sent where the kernel
// exposes pressure stall information.
var metricDescriptors = []*runtime.MetricDescriptor{
	// CPU
	{Name: "container_cpu_usage_seconds_total", Help: "Cumulative cpu time consumed in seconds.", LabelKeys: metricLabelKeys},
	{Name: "container_cpu_user_seconds_total", Help: "Cumulative user cpu time consumed in seconds.", LabelKeys: metricLabelKeys},
	{Name: "container_cpu_system_seconds_total", Help: "Cumulative system cpu time consumed in seconds.", LabelKeys: metricLabelKeys},
	{Name: "container_cpu_cfs_periods_total", Help: "Number of elapsed enforcement period intervals.", LabelKeys: metricLabelKeys},
	{Name: "container_cpu_cfs_throttled_periods_total", Help: "Number of throttled period intervals.", LabelKeys: metricLabelKeys},
	{Name: "container_cpu_cfs_throttled_seconds_total", Help: "Total time duration the container has been throttled.", LabelKeys: metricLabelKeys},
	// Memory
	{Name: "container_memory_usage_bytes", Help: "Current memory usage in bytes, including all memory regardless of when it was accessed", LabelKeys: metricLabelKeys},
	{Name: "container_memory_working_set_bytes", Help: "Current working set in bytes.", LabelKeys: metricLabelKeys},
	{Name: "container_memory_rss", Help: "Size of RSS in bytes.", LabelKeys: metricLabelKeys},
	{Name: "container_memory_swap", Help: "Container swap usage in bytes.", LabelKeys: metricLabelKeys},
	{Name: "container_memory_cache", Help: "Number of bytes of page cache memory.", LabelKeys: metricLabelKeys},
	{Name: "container_memory_mapped_file", Help: "Size of memory mapped files in bytes.", LabelKeys: metricLabelKeys},
	{Name: "container_memory_kernel_usage", Help: "Size of kernel memory allocated in bytes.", LabelKeys: metricLabelKeys},
	{Name: "container_memory_max_usage_bytes", Help: "Maximum memory usage recorded in bytes", LabelKeys: metricLabelKeys},
	{Name: "container_memory_failcnt", Help: "Number of memory usage hits limits", LabelKeys: metricLabelKeys},
	{Name: "container_memory_failures_total", Help: "Cumulative count of memory allocation failures.", LabelKeys: failureMetricLabelKeys},
	{Name: "container_oom_events_total", Help: "Count of out of memory events observed for the container", LabelKeys: metricLabelKeys},
	// Pressure stall information: only where the kernel exposes it
	// (cgroup v2 *.pressure files).
	{Name: "container_pressure_cpu_stalled_seconds_total", Help: "Total time duration no tasks in the container could make progress due to CPU congestion.", LabelKeys: metricLabelKeys},
	{Name: "container_pressure_cpu_waiting_seconds_total", Help: "Total time duration tasks in the container have waited due to CPU congestion.", LabelKeys: metricLabelKeys},
	{Name: "container_pressure_memory_stalled_seconds_total", Help: "Total time duration no tasks in the container could make progress due to memory congestion.", LabelKeys: metricLabelKeys},
	{Name: "container_pressure_memory_waiting_seconds_total", Help: "Total time duration tasks in the container have waited due to memory congestion.", LabelKeys: metricLabelKeys},
	{Name: "container_pressure_io_stalled_seconds_total", Help: "Total time duration no tasks in the container could make progress due to IO congestion.", LabelKeys: metricLabelKeys},
	{Name: "container_pressure_io_waiting_seconds_total", Help: "Total time duration tasks in the container have waited due to IO congestion.", LabelKeys: metricLabelKeys},
	// Processes
	{Name: "container_processes", Help: "Number of processes running inside the container.", LabelKeys: metricLabelKeys},
	{Name: "container_threads", Help: "Number of threads running inside the container", LabelKeys: metricLabelKeys},
	{Name: "container_threads_max", Help: "Maximum number of threads allowed inside the container, infinity if value is zero", LabelKeys: metricLabelKeys},
	{Name: "container_file_descriptors", Help: "Number of open file descriptors for the container.", LabelKeys: metricLabelKeys},
	{Name: "container_sockets", Help: "Number of open sockets for the container.", LabelKeys: metricLabelKeys},
	// Spec
	{Name: "container_spec_memory_limit_bytes", Help: "Memory limit for the container.", LabelKeys: metricLabelKeys},
	{Name: "container_spec_memory_swap_limit_bytes", Help: "Memory swap limit for the container.", LabelKeys: metricLabelKeys},
	{Name: "container_spec_cpu_period", Help: "CPU period of the container.", LabelKeys: metricLabelKeys},
	{Name: "container_spec_cpu_shares", Help: "CPU share of the container.", LabelKeys: metricLabelKeys},
	// Miscellaneous
	{Name: "container_last_seen", Help: "Last time a container was seen by the exporter", LabelKeys: metricLabelKeys},
	{Name: "container_start_time_seconds", Help: "Start time of the container since unix epoch in seconds.", LabelKeys: metricLabelKeys},
	// Filesystem
	{Name: "container_fs_usage_bytes", Help: "Number of bytes that are consumed by the container on this filesystem.", LabelKeys: fsMetricLabelKeys},
	{Name: "container_fs_limit_bytes", Help: "Number of bytes that can be consumed by the container on this filesystem.", LabelKeys: fsMetricLabelKeys},
	{Name: "container_fs_inodes_total", Help: "Number of Inodes", LabelKeys: fsMetricLabelKeys},
	{Name: "container_fs_inodes_free", Help: "Number of available Inodes", LabelKeys: fsMetricLabelKeys},
	// Block I/O
	{Name: "container_fs_reads_bytes_total", Help: "Cumulative count of bytes read", LabelKeys: fsMetricLabelKeys},
	{Name: "container_fs_writes_bytes_total", Help: "Cumulative count of bytes written", LabelKeys: fsMetricLabelKeys},
	{Name: "container_fs_reads_total", Help: "Cumulative count of reads completed", LabelKeys: fsMetricLabelKeys},
	{Name: "container_fs_writes_total", Help: "Cumulative count of writes completed", LabelKeys: fsMetricLabelKeys},
	{Name: "container_blkio_device_usage_total", Help: "Blkio device bytes usage", LabelKeys: blkioMetricLabelKeys},
	// Network (pod level)
	{Name: "container_network_receive_bytes_total", Help: "Cumulative count of bytes received", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_receive_packets_total", Help: "Cumulative count of packets received", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_receive_packets_dropped_total", Help: "Cumulative count of packets dropped while receiving", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_receive_errors_total", Help: "Cumulative count of errors encountered while receiving", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_transmit_bytes_total", Help: "Cumulative count of bytes transmitted", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_transmit_packets_total", Help: "Cumulative count of packets transmitted", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_transmit_packets_dropped_total", Help: "Cumulative count of packets dropped while transmitting", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_transmit_errors_total", Help: "Cumulative count of errors encountered while transmitting", LabelKeys: networkMetricLabelKeys},
}

// ListMetricDescriptors describes the metrics ListPodSandboxMetrics returns.
func (s *Service) ListMetricDescriptors(ctx context.Context, req *runtime.ListMetricDescriptorsRequest) (*runtime.ListMetricDescriptorsResponse, error) {
	return &runtime.ListMetricDescriptorsResponse{Descriptors: metricDescriptors}, nil
}
