package exits

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestUnclaimedTakeOnceAndPrune(t *testing.T) {
	var u Unclaimed
	if _, ok := u.Take(1); ok {
		t.Fatal("an empty set gave an exit")
	}
	t0 := time.Unix(1000, 0)
	u.Add(10, unix.WaitStatus(7<<8), t0)
	u.Add(11, unix.WaitStatus(9), t0.Add(30*time.Second))
	ws, ok := u.Take(10)
	if !ok || ws.ExitStatus() != 7 {
		t.Fatalf("take 10: %v %v", ws, ok)
	}
	if _, ok := u.Take(10); ok {
		t.Fatal("an exit was taken twice")
	}
	u.Add(12, 0, t0.Add(30*time.Second))
	// An exit 61 s after 11 and 12 drops them, older than a minute.
	u.Add(13, 0, t0.Add(91*time.Second))
	if u.Len() != 1 {
		t.Fatalf("%d exits kept after a minute, want only the new one", u.Len())
	}
	if _, ok := u.Take(13); !ok {
		t.Fatal("the new exit was dropped")
	}
}
