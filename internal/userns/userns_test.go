package userns

import (
	"errors"
	"testing"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/errdefs"
)

func TestFromCRI(t *testing.T) {
	line := func(c, h, l uint32) []*runtime.IDMapping {
		return []*runtime.IDMapping{{ContainerId: c, HostId: h, Length: l}}
	}
	ok := line(0, 1000, 100000)
	for _, tc := range []struct {
		name    string
		in      *runtime.UserNamespace
		want    *Mapping
		invalid bool
	}{
		{name: "unset is the host's"},
		{name: "node", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_NODE}},
		{name: "pod", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: ok, Gids: line(0, 2000, 65536)},
			want: &Mapping{UID: IDMap{HostID: 1000, Size: 100000}, GID: IDMap{HostID: 2000, Size: 65536}}},
		{name: "node with mappings", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_NODE, Uids: ok, Gids: ok}, invalid: true},
		{name: "container", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_CONTAINER}, invalid: true},
		{name: "target", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_TARGET}, invalid: true},
		{name: "pod without mappings", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD}, invalid: true},
		{name: "pod without gids", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: ok}, invalid: true},
		{name: "two lines", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: append(line(0, 1000, 10), line(10, 5000, 10)...), Gids: ok}, invalid: true},
		{name: "container id 0 not mapped", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: ok, Gids: line(1, 1000, 10)}, invalid: true},
		{name: "empty range", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: line(0, 1000, 0), Gids: ok}, invalid: true},
		{name: "overflowing range", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: line(0, 4294967000, 1000), Gids: ok}, invalid: true},
		{name: "nil line", in: &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: []*runtime.IDMapping{nil}, Gids: ok}, invalid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromCRI(tc.in)
			if tc.invalid {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err %v, want InvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if !Same(got, tc.in) {
				t.Fatalf("Same(%+v, %v) false", got, tc.in)
			}
		})
	}
}

func TestSame(t *testing.T) {
	m := &Mapping{UID: IDMap{HostID: 1000, Size: 10}, GID: IDMap{HostID: 1000, Size: 10}}
	l := []*runtime.IDMapping{{HostId: 1000, Length: 10}}
	other := []*runtime.IDMapping{{HostId: 1000, Length: 11}}
	switch {
	case !Same(m, &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: l, Gids: l}):
		t.Fatal("same mapping differs")
	case Same(m, &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: l, Gids: other}):
		t.Fatal("other GID range is the same")
	case Same(m, nil), Same(nil, &runtime.UserNamespace{Mode: runtime.NamespaceMode_POD, Uids: l, Gids: l}):
		t.Fatal("host's and a pod's are the same")
	case !Same(nil, nil), !SameLines(m.UID, l), SameLines(m.UID, other):
		t.Fatal("Same/SameLines")
	}
}
