package ocicli

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/berthcri/berth/internal/jsonlite"
)

// withLogError adds to err, the failure of a runtime call that logged to
// logPath (Create, Restore), the error messages the runtime wrote there,
// unless err already says them: runc's exit status alone names no cause.
func withLogError(err error, logPath string) error {
	if msg := LastLogError(logPath); msg != "" && !strings.Contains(err.Error(), msg) {
		return fmt.Errorf("%w: %s", err, msg)
	}
	return err
}

// LastLogError returns the error and fatal messages a runtime wrote to its
// JSON log, joined by "; ". It reads each line with jsonlite, not
// encoding/json, which the monitor does not link.
func LastLogError(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var msgs []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		var level, msg string
		err := jsonlite.StringFields(line, func(key, value string) {
			switch key {
			case "level":
				level = value
			case "msg":
				msg = value
			}
		})
		if err == nil && (level == "error" || level == "fatal") {
			msgs = append(msgs, msg)
		}
	}
	return strings.Join(msgs, "; ")
}

// jsonString is the string value of key in the JSON object data ("" if
// none, or not a string).
func jsonString(data []byte, key string) string {
	var v string
	_ = jsonlite.StringFields(data, func(k, value string) {
		if k == key {
			v = value
		}
	})
	return v
}
