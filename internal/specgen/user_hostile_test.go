package specgen

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// writeEtc replaces the rootfs's /etc/passwd and /etc/group.
func writeEtc(t *testing.T, root, passwd, group string) {
	t.Helper()
	for name, data := range map[string]string{"etc/passwd": passwd, "etc/group": group} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestResolveUserNumericNeverAName: an image USER (or a run_as_username)
// that the CRI's ImageStatus reports as a number is a number: out of
// runc's range it is InvalidArgument, never looked up as a name in the
// image's /etc/passwd (CVE-2026-46680), nor wrapped to 0 (CVE-2024-40635).
// The kubelet's runAsNonRoot check trusts ImageStatus's uid: "-1" or
// "4294967296" are not 0 there, so they must not become root here.
func TestResolveUserNumericNeverAName(t *testing.T) {
	const passwd = "root:x:0:0::/root:/bin/sh\n" +
		"4294967296:x:0:0::/:/bin/sh\n" +
		"-1:x:0:0::/:/bin/sh\n" +
		"+7:x:0:0::/:/bin/sh\n" +
		"18446744073709551616:x:0:0::/:/bin/sh\n" +
		"-4294967296:x:0:0::/:/bin/sh\n" +
		"wrap:x:4294967296:0::/:/bin/sh\n" +
		"neg:x:-1:0::/:/bin/sh\n" +
		"hex:x:0x10:0::/:/bin/sh\n" +
		"big:x:2147483648:0::/:/bin/sh\n" +
		"app:x:1000:1000::/:/bin/sh\n"
	const group = "root:x:0:\n-1:x:0:app\n4294967296:x:0:\napp:x:1000:\n"
	for _, tc := range []struct {
		name, imageUser, username string
		want                      *specs.User
	}{
		{name: "USER 2^32", imageUser: "4294967296"},
		{name: "USER -1", imageUser: "-1"},
		{name: "USER 2^64", imageUser: "18446744073709551616"},
		{name: "USER -2^32", imageUser: "-4294967296"},
		{name: "USER runc limit+1", imageUser: "2147483648"},
		{name: "USER uid:-1", imageUser: "1000:-1"},
		{name: "USER uid:2^32", imageUser: "1000:4294967296"},
		{name: "username 2^32", username: "4294967296"},
		{name: "username -1", username: "-1"},
		{name: "passwd uid 2^32", imageUser: "wrap"},
		{name: "passwd uid -1", imageUser: "neg"},
		{name: "passwd uid hex", imageUser: "hex"},
		{name: "passwd uid above runc limit", imageUser: "big"},
		// ImageStatus reports "+7" as uid 7: it runs as uid 7, not as
		// the passwd name "+7" (root).
		{name: "USER +7 is uid 7", imageUser: "+7", want: &specs.User{UID: 7, GID: 0, AdditionalGids: []uint32{0}}},
		// A group whose name looks like a number is still a group.
		{name: "USER app still a name", imageUser: "app", want: &specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{0, 1000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			writeEtc(t, in.RootfsPath, passwd, group)
			in.Image.Config.User = tc.imageUser
			sc(&in).RunAsUsername = tc.username
			got, err := resolveUser(&in)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("resolved %+v, want InvalidArgument", got)
				}
				wantErr(t, err, errInvalid)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.UID != tc.want.UID || got.GID != tc.want.GID || !slices.Equal(got.AdditionalGids, tc.want.AdditionalGids) {
				t.Fatalf("user = %+v, want %+v", got, *tc.want)
			}
		})
	}
}

// allocated is the bytes fn allocates on the heap.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestResolveUserDatabaseMemoryBounded: the image's /etc/group and
// /etc/passwd are hostile input (CVE-2026-47262, CVE-2025-4437). Member
// lists of one-letter names amplify: 1 MiB of "a,a,a,…" split into
// strings is 8 MiB of string headers, 16 such lines over 128 MiB. Looking
// up the user and its groups must allocate a bounded amount, well below
// the file's size, and a file over the cap is refused, not truncated.
func TestResolveUserDatabaseMemoryBounded(t *testing.T) {
	const line = 1<<20 - 64
	var group bytes.Buffer
	group.WriteString("app:x:1000:\n")
	for i := range 16 {
		start := group.Len()
		group.WriteString("g")
		group.WriteByte(byte('a' + i))
		group.WriteString(":x:")
		group.WriteString(string(rune('0' + i%10)))
		group.WriteString("00:")
		for group.Len()-start < line-2 {
			group.WriteString("a,")
		}
		group.WriteString("a\n")
	}
	// Many tiny passwd entries: 16 MiB of them is two million users.
	var passwd bytes.Buffer
	for passwd.Len() < 15<<20 {
		passwd.WriteString("a:x:1:1::/:\n")
	}
	passwd.WriteString("app:x:1000:1000::/:/bin/sh\n")

	for _, tc := range []struct {
		name     string
		user     string
		policy   criapi.SupplementalGroupsPolicy
		wantGids []uint32
	}{
		{name: "merge by name", user: "app", wantGids: []uint32{1000}},
		{name: "merge member of every group", user: "a", wantGids: []uint32{1, 0, 100, 200, 300, 400, 500, 600, 700, 800, 900}},
		{name: "merge by uid", user: "1000", wantGids: []uint32{1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			writeEtc(t, in.RootfsPath, passwd.String(), group.String())
			in.Image.Config.User = tc.user
			sc(&in).SupplementalGroupsPolicy = tc.policy
			var got specs.User
			var err error
			n := allocated(func() { got, err = resolveUser(&in) })
			if err != nil {
				t.Fatal(err)
			}
			want := slices.Clone(tc.wantGids)
			slices.Sort(want)
			want = slices.Compact(want)
			if !slices.Equal(got.AdditionalGids, want) {
				t.Errorf("groups = %v, want %v", got.AdditionalGids, want)
			}
			size := passwd.Len() + group.Len()
			t.Logf("allocated %d bytes for %d bytes of passwd and group", n, size)
			if limit := uint64(8 << 20); n > limit {
				t.Fatalf("resolving the user allocated %d MiB for a %d MiB user database: want under %d MiB",
					n>>20, size>>20, limit>>20)
			}
		})
	}

	// Over the cap: refused, whatever the user, without reading it.
	t.Run("file over the cap", func(t *testing.T) {
		in := testInput(t)
		p := filepath.Join(in.RootfsPath, "etc/group")
		if err := os.Truncate(p, 64<<20); err != nil {
			t.Fatal(err)
		}
		in.Image.Config.User = "berthuser"
		var err error
		n := allocated(func() { _, err = resolveUser(&in) })
		wantErr(t, err, errInvalid)
		if n > 4<<20 {
			t.Fatalf("refusing a 64 MiB /etc/group allocated %d MiB", n>>20)
		}
	})
	// A line over the cap: refused as the image's fault.
	t.Run("line over the cap", func(t *testing.T) {
		in := testInput(t)
		writeEtc(t, in.RootfsPath, "berthuser:x:1000:1000:"+string(bytes.Repeat([]byte("x"), 2<<20))+"\n", "")
		in.Image.Config.User = "berthuser"
		_, err := resolveUser(&in)
		wantErr(t, err, errInvalid)
	})
}

// FuzzResolveUser: whatever the image's /etc/passwd, /etc/group and USER
// hold, resolving never panics, and a USER that is a number runs as
// that number or is refused: never as another uid (root above all).
func FuzzResolveUser(f *testing.F) {
	f.Add("root:x:0:0::/:/bin/sh\n-1:x:0:0::/:\napp:x:1000:1000::/:\n", "app:x:1000:\ng:x:5:a,app,b\n", "app")
	f.Add("-1:x:0:0::/:\n", "", "-1")
	f.Add("a:x:1:1\n", "g:x:2:a\n", "1:g")
	f.Add("+7:x:0:0\n", "", "+7")
	f.Fuzz(func(t *testing.T, passwd, group, user string) {
		in := testInput(t)
		writeEtc(t, in.RootfsPath, passwd, group)
		in.Image.Config.User = user
		got, err := resolveUser(&in)
		if err != nil {
			return
		}
		userPart, _, _ := strings.Cut(user, ":")
		if n, perr := strconv.ParseInt(userPart, 10, 64); perr == nil && int64(got.UID) != n {
			t.Fatalf("USER %q ran as uid %d", user, got.UID)
		}
		if got.UID > maxID || got.GID > maxID {
			t.Fatalf("USER %q: ids out of runc's range: %+v", user, got)
		}
	})
}
