// Command berth-pause holds a pod's shared PID namespace: berthd starts it
// as pid 1 of a new PID namespace only for pods that ask for one. berthd
// also starts it in a new user namespace to create a user namespace pod's
// namespaces, and kills it once they are pinned (unless it is also that
// pod's PID namespace holder). It
// sleeps, reaps orphaned children (it is their init) and exits on SIGTERM
// or SIGINT. Its one argument, the pod's state directory, is only there to
// make the process easy to attribute.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// Started through /proc/self/fd/N (a user namespace pod's holder), the
	// kernel names the process "N": name it for ps and pgrep.
	_ = os.WriteFile("/proc/self/comm", []byte("berth-pause"), 0)
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
