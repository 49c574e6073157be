// Command berth-pause holds a pod's shared PID namespace: berthd starts it
// as pid 1 of a new PID namespace only for pods that ask for one. It
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
