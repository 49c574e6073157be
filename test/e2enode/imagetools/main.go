// Command imagetools is a small static multi-call program the node e2e
// stand-in images carry where upstream's images have programs Debian's
// busybox-static lacks. It acts by the name it is called under:
//
//	nmeter   the busybox applet as the container-lifecycle specs call it
//	         (nmeter -d0 '%3t'): prints the time of day with milliseconds,
//	         one line per interval, until its output is closed
//	nnp      the nonewprivs image's program: prints "Effective uid: N"
//	pause    the pause image's program: sleeps until SIGINT or SIGTERM,
//	         reaping children as PID 1 does
//	curl     the subset of curl the e2e framework's network checks use
//	         (curl.go)
//	nc       netcat's client mode with -u (UDP), which busybox's nc lacks;
//	         other uses go to busybox nc (nc.go)
//	sh       busybox's ash, but a plain `sh -c 'CMD ARGS'` runs CMD with
//	         the environment names ash drops (shenv.go)
//	dig      the subset of BIND's dig the cluster suite's DNS specs run
//	         (dig.go)
//	getent   `getent hosts NAME`: /etc/hosts, then DNS (dig.go)
//
// It is a test fixture of make e2e-node (hack/e2e-node.sh) and make
// e2e-cluster (hack/e2e-cluster.sh), not part of berth.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	// "imagetools NAME args..." works too, for trying it out.
	if name == "imagetools" && len(args) > 0 {
		name, args = args[0], args[1:]
	}
	var err error
	switch name {
	case "nmeter":
		err = nmeter(args)
	case "nnp":
		fmt.Printf("Effective uid: %d\n", os.Geteuid())
	case "pause":
		pause()
	case "curl":
		os.Exit(curl(args, os.Stdout, os.Stderr))
	case "nc":
		err = nc(args)
	case "sh":
		err = sh(args)
	case "dig":
		os.Exit(dig(args, os.Stdout))
	case "getent":
		os.Exit(getent(args, os.Stdout))
	default:
		err = fmt.Errorf("unknown program %q (want nmeter, nnp, pause, curl, nc, sh, dig or getent)", name)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// nmeter supports the subset the e2e suite uses: -dN (delay between lines
// in milliseconds) and a format of text with %t (time of day, seconds) or
// %Nt (with N digits of fractions). Like busybox's, the time is local time,
// which is UTC in a container.
func nmeter(args []string) error {
	delay := time.Second
	format := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-d" && i+1 < len(args):
			i++
			a = "-d" + args[i]
			fallthrough
		case strings.HasPrefix(a, "-d"):
			var ms int
			if _, err := fmt.Sscanf(a[2:], "%d", &ms); err != nil {
				return fmt.Errorf("bad delay %q", a)
			}
			delay = time.Duration(ms) * time.Millisecond
		default:
			format = a
		}
	}
	if format == "" {
		return fmt.Errorf("usage: nmeter [-d MSEC] FORMAT")
	}
	for {
		if _, err := fmt.Println(expand(format, time.Now())); err != nil {
			return nil // the reader went away (| head -n1): done
		}
		time.Sleep(delay)
	}
}

// expand replaces %t and %Nt in format with the time of day.
func expand(format string, now time.Time) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		digits := 0
		if format[j] >= '0' && format[j] <= '9' {
			digits = int(format[j] - '0')
			j++
		}
		if j < len(format) && format[j] == 't' {
			b.WriteString(now.Format("15:04:05"))
			if digits > 0 {
				frac := fmt.Sprintf("%09d", now.Nanosecond())
				b.WriteString("." + frac[:min(digits, 9)])
			}
			i = j
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// pause is what registry.k8s.io/pause does: nothing, until told to stop;
// as PID 1 of a pod sharing its PID namespace it also reaps orphans.
func pause() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
