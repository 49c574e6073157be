package runtimeerr

import (
	"errors"
	"strings"
	"testing"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestNew(t *testing.T) {
	exit := errors.New("exit status 1")
	err := New([]string{"/usr/sbin/runc", "--root", "/r", "delete", "c1"}, "c1",
		[]byte(`time="2026-11-22T07:00:00Z" level=error msg="container \"c1\" does not exist"`+"\n"), exit)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `runc delete c1`) || !strings.Contains(err.Error(), `container "c1" does not exist`) {
		t.Fatalf("not found: %v", err)
	}
	err = New([]string{"crun", "start", "c2"}, "c2", []byte("plain failure\n"), exit)
	if errors.Is(err, errdefs.ErrNotFound) || err.Error() != "crun start c2: exit status 1: plain failure" {
		t.Fatalf("plain: %v", err)
	}
	if err := New([]string{"runc", "frobnicate"}, "c3", nil, exit); !errors.Is(err, exit) || err.Error() != "runc ? c3: exit status 1" {
		t.Fatalf("no stderr: %v", err)
	}
}
