package cri

import (
	"strings"
	"syscall"

	"github.com/moby/sys/signal"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stopSignalName turns ContainerConfig.stop_signal (KEP-4960) into the
// name the container record keeps ("SIGUSR1", "SIGRTMIN+3"); "" for
// SIGNAL_RUNTIME_DEFAULT (the image's STOPSIGNAL, else SIGTERM). ok is
// false for a value the enum does not name.
func stopSignalName(s runtime.Signal) (name string, ok bool) {
	if s == runtime.Signal_SIGNAL_RUNTIME_DEFAULT {
		return "", true
	}
	enum, known := runtime.Signal_name[int32(s)]
	if !known {
		return "", false
	}
	name = strings.TrimPrefix(enum, "SIGNAL_")
	name = strings.Replace(name, "PLUS", "+", 1)
	name = strings.Replace(name, "MINUS", "-", 1)
	return name, true
}

// preferredSignal names the enum value ContainerStatus reports for a
// signal number with several names (SIGIOT is SIGABRT, SIGCLD SIGCHLD,
// SIGPOLL SIGIO).
var preferredSignal = map[syscall.Signal]runtime.Signal{
	syscall.SIGABRT: runtime.Signal_SIGNAL_SIGABRT,
	syscall.SIGCHLD: runtime.Signal_SIGNAL_SIGCHLD,
	syscall.SIGIO:   runtime.Signal_SIGNAL_SIGIO,
}

// criStopSignal is the effective stop signal ContainerStatus reports: the
// record's (the config's or the image's), SIGTERM when it has none. A name
// the enum has is kept as given (SIGIOT stays SIGIOT); a number or another
// spelling ("9", "KILL", "RTMIN+1") maps through its signal number.
func criStopSignal(name string) runtime.Signal {
	if name == "" {
		return runtime.Signal_SIGNAL_SIGTERM
	}
	enum := strings.ToUpper(name)
	if !strings.HasPrefix(enum, "SIG") {
		enum = "SIG" + enum
	}
	enum = strings.Replace(strings.Replace(enum, "+", "PLUS", 1), "-", "MINUS", 1)
	if v, ok := runtime.Signal_value["SIGNAL_"+enum]; ok {
		return runtime.Signal(v)
	}
	num, err := signal.ParseSignal(name)
	if err != nil {
		return runtime.Signal_SIGNAL_RUNTIME_DEFAULT
	}
	if v, ok := preferredSignal[num]; ok {
		return v
	}
	for v := range runtime.Signal_name {
		n, _ := stopSignalName(runtime.Signal(v))
		if n == "" {
			continue
		}
		if got, err := signal.ParseSignal(n); err == nil && got == num {
			return runtime.Signal(v)
		}
	}
	return runtime.Signal_SIGNAL_RUNTIME_DEFAULT
}
