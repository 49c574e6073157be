package specgen

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestResolveUser(t *testing.T) {
	i64 := func(v int64) *runtime.Int64Value { return &runtime.Int64Value{Value: v} }
	for _, tc := range []struct {
		name      string
		imageUser string
		username  string
		uid, gid  *runtime.Int64Value
		supp      []int64
		policy    runtime.SupplementalGroupsPolicy
		want      specs.User
		err       error
	}{
		{name: "root default", want: specs.User{UID: 0, GID: 0, AdditionalGids: []uint32{0}}},
		{name: "image name merges /etc/group membership", imageUser: "berthuser",
			want: specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{1000, 2000, 4000}}},
		{name: "image uid resolves name for groups", imageUser: "1000",
			want: specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{1000, 2000, 4000}}},
		{name: "image uid:gid numeric", imageUser: "1000:1234",
			want: specs.User{UID: 1000, GID: 1234, AdditionalGids: []uint32{1234, 2000, 4000}}},
		{name: "image name:group", imageUser: "berthuser:berthextra",
			want: specs.User{UID: 1000, GID: 2000, AdditionalGids: []uint32{2000, 4000}}},
		{name: "image unknown uid runs gid 0", imageUser: "4242",
			want: specs.User{UID: 4242, GID: 0, AdditionalGids: []uint32{0}}},
		{name: "image unknown name", imageUser: "ghost", err: errInvalid},
		{name: "image unknown group", imageUser: "berthuser:ghost", err: errInvalid},
		{name: "image bad user", imageUser: "a:b:c", err: errInvalid},
		{name: "image empty group", imageUser: "berthuser:", err: errInvalid},
		{name: "run_as_user overrides image", imageUser: "berthuser", uid: i64(65534),
			want: specs.User{UID: 65534, GID: 65534, AdditionalGids: []uint32{65534}}},
		{name: "run_as_user + run_as_group", uid: i64(1000), gid: i64(3333),
			want: specs.User{UID: 1000, GID: 3333, AdditionalGids: []uint32{2000, 3333, 4000}}},
		{name: "run_as_username", username: "berthuser",
			want: specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{1000, 2000, 4000}}},
		{name: "run_as_username wins over run_as_user", username: "berthuser", uid: i64(0),
			want: specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{1000, 2000, 4000}}},
		{name: "run_as_group without user", gid: i64(5), err: errInvalid},
		{name: "run_as_group without user but image user", imageUser: "berthuser", gid: i64(5), err: errInvalid},
		{name: "negative uid", uid: i64(-1), err: errInvalid},
		{name: "uid above runc limit", uid: i64(1 << 32), err: errInvalid},
		{name: "merge adds config groups", username: "berthuser", supp: []int64{1234, 5678},
			want: specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{1000, 1234, 2000, 4000, 5678}}},
		{name: "strict: only primary and config", username: "berthuser", supp: []int64{1234},
			policy: runtime.SupplementalGroupsPolicy_Strict,
			want:   specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{1000, 1234}}},
		{name: "negative supplemental group", supp: []int64{-3}, err: errInvalid},
		{name: "unknown policy", policy: 7, err: errInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(t)
			in.Image.Config.User = tc.imageUser
			s := sc(&in)
			s.RunAsUsername, s.RunAsUser, s.RunAsGroup = tc.username, tc.uid, tc.gid
			s.SupplementalGroups, s.SupplementalGroupsPolicy = tc.supp, tc.policy
			got, err := resolveUser(&in)
			wantErr(t, err, tc.err)
			if tc.err != nil {
				return
			}
			if got.UID != tc.want.UID || got.GID != tc.want.GID || !slices.Equal(got.AdditionalGids, tc.want.AdditionalGids) {
				t.Fatalf("user = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// An image whose /etc/passwd is a symlink out of the rootfs must not make
// berth read the host's file.
func TestResolveUserStaysInRootfs(t *testing.T) {
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "passwd"), []byte("evil:x:0:0::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := testInput(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(host, "passwd"), filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	in.RootfsPath = root
	sc(&in).RunAsUsername = "evil"
	if _, err := resolveUser(&in); err == nil {
		t.Fatal("resolved a user from a file outside the rootfs")
	}
}

func TestResolveUserNoPasswd(t *testing.T) {
	in := testInput(t)
	in.RootfsPath = t.TempDir()
	sc(&in).RunAsUser = &runtime.Int64Value{Value: 7}
	u, err := resolveUser(&in)
	if err != nil {
		t.Fatal(err)
	}
	if u.UID != 7 || u.GID != 0 {
		t.Fatalf("user = %+v", u)
	}
	sc(&in).RunAsUsername = "someone"
	if _, err := resolveUser(&in); err == nil {
		t.Fatal("a name resolved without /etc/passwd")
	}
}

func TestResolveUserFIFORefused(t *testing.T) {
	in := testInput(t)
	p := filepath.Join(in.RootfsPath, "etc/passwd")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := mkfifo(p); err != nil {
		t.Skip("mkfifo:", err)
	}
	sc(&in).RunAsUsername = "berthuser"
	_, err := resolveUser(&in)
	wantErr(t, err, errInvalid)
}
