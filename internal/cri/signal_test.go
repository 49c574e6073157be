package cri

import (
	"testing"

	"github.com/moby/sys/signal"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestStopSignalNames(t *testing.T) {
	for sig, want := range map[runtime.Signal]string{
		runtime.Signal_SIGNAL_RUNTIME_DEFAULT: "",
		runtime.Signal_SIGNAL_SIGUSR1:         "SIGUSR1",
		runtime.Signal_SIGNAL_SIGRTMINPLUS3:   "SIGRTMIN+3",
		runtime.Signal_SIGNAL_SIGRTMAXMINUS14: "SIGRTMAX-14",
	} {
		if got, ok := stopSignalName(sig); !ok || got != want {
			t.Errorf("%v: %q %v, want %q", sig, got, ok, want)
		}
	}
	if _, ok := stopSignalName(runtime.Signal(999)); ok {
		t.Error("999 accepted")
	}
	// Every enum value names a signal berth can send, and reads back as
	// itself.
	for v := range runtime.Signal_name {
		sig := runtime.Signal(v)
		name, _ := stopSignalName(sig)
		if name == "" {
			continue
		}
		if n, err := signal.ParseSignal(name); err != nil || !signal.ValidSignalForPlatform(n) {
			t.Errorf("%v → %q: %v", sig, name, err)
		}
		if got := criStopSignal(name); got != sig {
			t.Errorf("%v → %q → %v", sig, name, got)
		}
	}
}

func TestCRIStopSignalOfImageSpellings(t *testing.T) {
	for name, want := range map[string]runtime.Signal{
		"":           runtime.Signal_SIGNAL_SIGTERM, // nothing set: the runtime's default
		"9":          runtime.Signal_SIGNAL_SIGKILL,
		"quit":       runtime.Signal_SIGNAL_SIGQUIT,
		"RTMIN+1":    runtime.Signal_SIGNAL_SIGRTMINPLUS1,
		"SIGRTMAX":   runtime.Signal_SIGNAL_SIGRTMAX,
		"6":          runtime.Signal_SIGNAL_SIGABRT,
		"17":         runtime.Signal_SIGNAL_SIGCHLD,
		"SIGIOT":     runtime.Signal_SIGNAL_SIGIOT,
		"not-a-sig":  runtime.Signal_SIGNAL_RUNTIME_DEFAULT,
		"SIGRTMIN+1": runtime.Signal_SIGNAL_SIGRTMINPLUS1,
	} {
		if got := criStopSignal(name); got != want {
			t.Errorf("%q: %v, want %v", name, got, want)
		}
	}
}
