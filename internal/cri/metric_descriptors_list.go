package cri

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Label keys as cAdvisor (and containerd) name them; pod-level metrics
// leave container and image empty.
var (
	metricLabelKeys        = []string{"pod", "namespace", "container", "id", "image"}
	networkMetricLabelKeys = []string{"pod", "namespace", "container", "id", "image", "interface"}
	fsMetricLabelKeys      = []string{"pod", "namespace", "container", "id", "image", "device"}
)

// metricDescriptors are the cAdvisor metrics ListPodSandboxMetrics fills,
// for the kubelet's /metrics/cadvisor.
var metricDescriptors = []*runtime.MetricDescriptor{
	{Name: "container_cpu_usage_seconds_total", Help: "Cumulative cpu time consumed in seconds.", LabelKeys: metricLabelKeys},
	{Name: "container_memory_usage_bytes", Help: "Current memory usage in bytes, including all memory regardless of when it was accessed", LabelKeys: metricLabelKeys},
	{Name: "container_memory_working_set_bytes", Help: "Current working set in bytes.", LabelKeys: metricLabelKeys},
	{Name: "container_memory_rss", Help: "Size of RSS in bytes.", LabelKeys: metricLabelKeys},
	{Name: "container_memory_swap", Help: "Container swap usage in bytes.", LabelKeys: metricLabelKeys},
	{Name: "container_spec_memory_limit_bytes", Help: "Memory limit for the container.", LabelKeys: metricLabelKeys},
	{Name: "container_last_seen", Help: "Last time a container was seen by the exporter", LabelKeys: metricLabelKeys},
	{Name: "container_start_time_seconds", Help: "Start time of the container since unix epoch in seconds.", LabelKeys: metricLabelKeys},
	{Name: "container_fs_usage_bytes", Help: "Number of bytes that are consumed by the container on this filesystem.", LabelKeys: fsMetricLabelKeys},
	{Name: "container_network_receive_bytes_total", Help: "Cumulative count of bytes received", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_receive_errors_total", Help: "Cumulative count of errors encountered while receiving", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_transmit_bytes_total", Help: "Cumulative count of bytes transmitted", LabelKeys: networkMetricLabelKeys},
	{Name: "container_network_transmit_errors_total", Help: "Cumulative count of errors encountered while transmitting", LabelKeys: networkMetricLabelKeys},
}

// ListMetricDescriptors describes the metrics ListPodSandboxMetrics returns.
func (s *Service) ListMetricDescriptors(ctx context.Context, req *runtime.ListMetricDescriptorsRequest) (*runtime.ListMetricDescriptorsResponse, error) {
	return &runtime.ListMetricDescriptorsResponse{Descriptors: metricDescriptors}, nil
}
