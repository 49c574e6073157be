package integration

import (
	"strings"
	"testing"
)

// kubeletView rebuilds a container's output from its CRI log the way the
// kubelet's reader does (kuberuntime logs: an F record's content is given
// its newline back, a P record's is not), which is also what it takes a
// FallbackToLogsOnError termination message from.
func kubeletView(recs []logRecord, stream string) string {
	var b strings.Builder
	for _, r := range recs {
		if r.stream != stream {
			continue
		}
		b.WriteString(r.msg)
		if r.tag == "F" {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// TestLogFinalLineWithoutNewlineIsPartial: output that ends without a
// newline (the node e2e spec "should report termination message from log
// output if TerminationMessagePolicy FallbackToLogsOnError is set" runs
// `echo -n DONE; false`) is logged as a P record, as containerd does, so
// the kubelet reads back "DONE" and not "DONE\n".
func TestLogFinalLineWithoutNewlineIsPartial(t *testing.T) {
	t.Parallel()
	e := newCtrEnv(t)
	for _, tc := range []struct {
		name, script, want string
	}{
		{"done", "echo -n DONE; false", "DONE"},
		{"lines", "echo first; echo -n second; false", "first\nsecond"},
		{"eol", "echo DONE; false", "DONE\n"},
		{"empty", "false", ""},
	} {
		st := e.waitExited(e.run(e.config(tc.name, "sh", "-c", tc.script)))
		if st.ExitCode != 1 {
			t.Fatalf("%s: exit code %d", tc.name, st.ExitCode)
		}
		recs := readCRILog(t, st.LogPath)
		if got := kubeletView(recs, "stdout"); got != tc.want {
			t.Errorf("%s: the kubelet reads %q from the log, want %q (records %+v)", tc.name, got, tc.want, recs)
		}
	}
}
