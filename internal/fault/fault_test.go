package fault

import (
	"errors"
	"testing"
)

func TestNilInjectorIsDisarmed(t *testing.T) {
	var in *Injector
	if in.Armed(SandboxAfterCNIAdd) {
		t.Fatal("nil injector armed")
	}
	in.Hit(SandboxAfterCNIAdd) // must not exit or panic
}

func TestFromEnv(t *testing.T) {
	t.Setenv(EnvVar, "")
	if in, err := FromEnv(nil); in != nil || err != nil {
		t.Fatalf("unset: got %v, %v", in, err)
	}
	t.Setenv(EnvVar, "after-cni-add, mid-unpack")
	in, err := FromEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Armed(SandboxAfterCNIAdd) || !in.Armed(ImageMidUnpack) || in.Armed(ContainerMidRemove) {
		t.Fatalf("armed set wrong: %v", in.armed)
	}
	var code int
	in.exit = func(c int) { code = c }
	in.Hit(ContainerMidRemove)
	if code != 0 {
		t.Fatalf("disarmed point exited with %d", code)
	}
	in.Hit(ImageMidUnpack)
	if code != ExitCode {
		t.Fatalf("armed point: exit code %d, want %d", code, ExitCode)
	}
	t.Setenv(EnvVar, "after-cni-ad")
	if _, err := FromEnv(nil); err == nil {
		t.Fatal("unknown point accepted")
	}
}

func TestFailPointFailsWithoutExiting(t *testing.T) {
	var nilIn *Injector
	if err := nilIn.Fail(ContainerFailStartRecordWrite); err != nil {
		t.Fatalf("nil injector failed: %v", err)
	}
	in, err := New([]Point{ContainerFailStartRecordWrite}, nil)
	if err != nil {
		t.Fatal(err)
	}
	in.exit = func(c int) { t.Fatalf("a failure point exited with %d", c) }
	if err := in.Fail(ContainerFailStartRecordWrite); !errors.Is(err, ErrInjected) {
		t.Fatalf("armed failure point: %v, want ErrInjected", err)
	}
	in.Hit(ContainerFailStartRecordWrite) // never a crash point
	if in2, _ := New([]Point{ContainerMidRemove}, nil); in2.Fail(ContainerFailStartRecordWrite) != nil {
		t.Fatal("a disarmed failure point failed")
	}
}
