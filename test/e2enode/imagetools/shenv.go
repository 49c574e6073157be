package main

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// sh is busybox's ash, except that `sh -c 'CMD ARGS'` with a simple
// command (words of plain characters, no quoting, variables, operators
// or assignments) that names a program on PATH runs it directly, as ash
// itself would exec it, but with the environment as given. Debian's
// busybox 1.35 ash drops environment entries whose names are not shell
// names ("data-1", "p-data-1", "$_-data-1") from what its commands get;
// upstream's busybox image passes them, and the ConfigMap and Secret
// specs read them back with `sh -c env`.
func sh(args []string) error {
	if len(args) == 2 && args[0] == "-c" {
		if words, ok := simpleCommand(args[1]); ok {
			if path, err := exec.LookPath(words[0]); err == nil {
				return syscall.Exec(path, words, os.Environ())
			}
		}
	}
	// ash names itself by argv[0] in its messages ("/bin/sh: can't
	// create ..."), so keep it.
	return syscall.Exec(busybox, os.Args, os.Environ())
}

const busybox = "/bin/busybox"

// simpleCommand splits script into words if it is one plain command.
func simpleCommand(script string) ([]string, bool) {
	words := strings.Fields(script)
	if len(words) == 0 || strings.Contains(words[0], "=") {
		return nil, false
	}
	for _, c := range script {
		plain := c == ' ' || c == '_' || c == '.' || c == '/' || c == '-' || c == ':' || c == ',' || c == '+' || c == '=' || c == '@' ||
			(c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
		if !plain {
			return nil, false
		}
	}
	return words, true
}
