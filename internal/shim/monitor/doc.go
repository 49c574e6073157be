// Package monitor is berth-shim's monitor mode: the process, one per node
// (decision 1701), that creates every pod's containers through the OCI
// runtime (package oci/ocicli, decision 2800), copies their output into
// CRI logs and persists their exits. Its parent, the keeper (package
// shim/keeper), reaps the containers, keeps a copy of their stdio and
// restarts the monitor if it dies. It speaks the protocol of package
// shim/proto (decision 0300) and is built to stay small (decision 0303):
// no encoding/json, net, os/exec or os/signal, no thread parked in the
// kernel, nothing allocated per log line.
//
// Two types carry it: Monitor, the process (one per node: the node's
// socket, its pods, the keeper link), and Pod, one pod it serves (the
// pod's socket and directory, its containers). berthd's client (package
// shim) talks to a Pod as it once talked to a per-pod shim: same socket
// path, same exit files.
//
// Files by concern: monitor.go the process and its pods, keeper.go the
// link to the keeper and adoption, pod.go a pod and its registry of
// containers, dispatch.go the connections and ops, container.go a
// container's state, lifecycle.go create/start/kill/delete, runtime.go
// the OCI runtime through the reaper, exit.go reaping and persisting an
// exit, wait.go parked waits, logs.go CRI logs, attach.go attach streams
// and stdio, housekeeping.go the periodic chores and memory trimming.
package monitor
