package monitor

import (
	"os"
	"path/filepath"
	"testing"
)

// A scope that systemd removed before the monitor read its kill: the pod
// slice's hierarchical oom_kill, above the count kept while the scope was
// there, is the container's kill; an unchanged one, or a scope still
// there, is not.
func TestOOMWatchParentKilledAfterTheScopeIsGone(t *testing.T) {
	slice := t.TempDir()
	scope := filepath.Join(slice, "berth-c1.scope")
	writeEvents := func(dir string, kills int) {
		t.Helper()
		data := "low 0\nhigh 0\nmax 7\noom 1\noom_kill " + string(rune('0'+kills)) + "\noom_group_kill 0\n"
		if err := os.WriteFile(filepath.Join(dir, "memory.events"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeEvents(slice, 2) // two kills of siblings before this container
	w := &oomWatch{}
	w.parentBase.Store(2)

	if w.parentKilled(scope) {
		t.Fatal("killed with the parent's count unchanged")
	}
	if err := os.Mkdir(scope, 0o755); err != nil {
		t.Fatal(err)
	}
	writeEvents(scope, 0)
	writeEvents(slice, 3)
	if w.parentKilled(scope) {
		t.Fatal("killed while the scope is there to read (its own count is the answer)")
	}
	if err := os.RemoveAll(scope); err != nil {
		t.Fatal(err)
	}
	if !w.parentKilled(scope) {
		t.Fatal("not killed: the parent counted a kill after the scope went")
	}
	var none *oomWatch
	if none.parentKilled(scope) {
		t.Fatal("a container without a watch reported killed")
	}
	w.parentBase.Store(-1)
	if w.parentKilled(scope) {
		t.Fatal("killed without a kept parent count (v1, or the root as parent)")
	}
}
