package container

import (
	"testing"
	"time"
)

// Adding a pod to the monitor blocks another add of the same pod but not
// of a different pod, and the lock map empties once nobody holds a lock.
func TestPodShimLockIsPerPod(t *testing.T) {
	s := newBerthShims(t.TempDir(), "berth-shim", nil)
	unlockA := s.lockPod("pod-a")

	otherPod := make(chan struct{})
	go func() { s.lockPod("pod-b")(); close(otherPod) }()
	select {
	case <-otherPod:
	case <-time.After(5 * time.Second):
		t.Fatal("a launch in pod-b waited for pod-a's lock")
	}

	samePod := make(chan struct{})
	go func() { s.lockPod("pod-a")(); close(samePod) }()
	select {
	case <-samePod:
		t.Fatal("a second launch in pod-a did not wait for the first")
	case <-time.After(100 * time.Millisecond):
	}
	unlockA()
	select {
	case <-samePod:
	case <-time.After(5 * time.Second):
		t.Fatal("the second launch in pod-a never got the lock")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.launches) != 0 {
		t.Fatalf("%d shim locks left with no holder", len(s.launches))
	}
}
