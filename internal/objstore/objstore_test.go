package objstore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/berthcri/berth/internal/errdefs"
)

type thing struct {
	ID      string    `json:"id"`
	Group   string    `json:"group"`
	Created time.Time `json:"created"`
}

type thingEntry struct {
	View[thing]
}

func newThing(id, group string, created int64) *thingEntry {
	e := &thingEntry{}
	e.Publish(&thing{ID: id, Group: group, Created: time.Unix(created, 0)})
	return e
}

var things = Kind[thing]{
	Name:    "thing",
	Clone:   func(t *thing) *thing { c := *t; return &c },
	Created: func(t *thing) time.Time { return t.Created },
	Group:   func(t *thing) string { return t.Group },
}

func ids(ts []*thing) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

func TestNames(t *testing.T) {
	s := New[thing, *thingEntry](things)
	if err := s.Reserve("web", "a1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve("web", "a1"); err != nil {
		t.Errorf("reserving again for the holder: %v", err)
	}
	if err := s.Reserve("web", "b2"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("reserving a held name: %v, want AlreadyExists", err)
	}
	s.Release("web", "b2") // not the holder: nothing
	if err := s.Reserve("web", "b2"); err == nil {
		t.Error("a release by another ID freed the name")
	}
	s.Release("web", "a1")
	if err := s.Reserve("web", "b2"); err != nil {
		t.Errorf("after release: %v", err)
	}
	// Add takes the name whoever held it (loading records); Delete frees it.
	s.Add("c3", "web", newThing("c3", "", 1))
	if err := s.Reserve("web", "b2"); err == nil {
		t.Error("name taken by Add still reservable by its old holder")
	}
	s.Delete("c3", "web")
	if err := s.Reserve("web", "d4"); err != nil {
		t.Errorf("after Delete: %v", err)
	}
}

func TestLookupListAll(t *testing.T) {
	s := New[thing, *thingEntry](things)
	s.Add("abc1", "", newThing("abc1", "p", 3))
	s.Add("abc2", "", newThing("abc2", "q", 1))
	gone := newThing("bcd3", "p", 2)
	s.Add("bcd3", "", gone)

	if e, err := s.Lookup("bc"); err != nil || e != gone {
		t.Errorf("unique prefix: %v, %v", e, err)
	}
	if _, err := s.Lookup("abc"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ambiguous prefix: %v, want InvalidArgument", err)
	}
	if _, err := s.Get("zz"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown: %v, want NotFound", err)
	}
	got, err := s.Get("abc1")
	if err != nil || got.ID != "abc1" {
		t.Fatalf("Get: %v %v", got, err)
	}
	got.ID = "changed"
	if again, _ := s.Get("abc1"); again.ID != "abc1" {
		t.Error("Get handed out the snapshot itself, not a copy")
	}
	if l := ids(s.List()); !slices.Equal(l, []string{"abc2", "bcd3", "abc1"}) {
		t.Errorf("List %v, want oldest first", l)
	}
	if l := ids(s.ListGroup("p")); !slices.Equal(l, []string{"bcd3", "abc1"}) {
		t.Errorf("ListGroup %v", l)
	}

	// Withdrawn: found by Lookup (its entry is still indexed), but not
	// by Get, List or All.
	gone.Withdraw()
	if _, err := s.Get("bcd3"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("withdrawn: %v, want NotFound", err)
	}
	var all []*thing
	for v := range s.All() {
		all = append(all, v)
	}
	if l := ids(all); !slices.Equal(l, []string{"abc2", "abc1"}) {
		t.Errorf("All %v", l)
	}
	for range s.All() {
		break // stopping early is fine
	}

	s.Delete("bcd3", "")
	if s.Has("bcd3") || s.Len() != 2 || len(s.ListGroup("p")) != 1 || len(s.IDs()) != 2 {
		t.Errorf("after Delete: has %v, len %d, group %v", s.Has("bcd3"), s.Len(), ids(s.ListGroup("p")))
	}
	s.Delete("abc1", "")
	if len(s.groups) != 1 {
		t.Errorf("an emptied group is kept: %v", s.groups)
	}
}

func TestRecords(t *testing.T) {
	r := Records[thing]{Dir: filepath.Join(t.TempDir(), "things"), File: "thing.json", Legacy: []string{"old.json"}}
	if ids, err := r.IDs(); err != nil || len(ids) != 0 {
		t.Fatalf("IDs of a new dir: %v %v", ids, err)
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if err := os.Mkdir(r.ObjectDir(id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	want := thing{ID: "a", Group: "g", Created: time.Unix(5, 0).UTC()}
	if err := r.Save("a", &want); err != nil {
		t.Fatal(err)
	}
	if err := r.SaveSoon("a", &want); err != nil { // nil Deferred: as Save
		t.Fatal(err)
	}
	if got, err := r.Load("a"); err != nil || !got.Created.Equal(want.Created) || got.Group != "g" {
		t.Errorf("Load: %+v %v", got, err)
	}
	if entries, _ := os.ReadDir(r.ObjectDir("a")); len(entries) != 1 {
		t.Errorf("files left beside the record: %v", entries)
	}
	if _, err := r.Load("b"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing record: %v, want ErrNotExist", err)
	}
	if err := os.WriteFile(r.Path("c"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load("c"); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty record: %v, want ErrEmpty", err)
	}
	if err := os.WriteFile(r.Path("d"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Load("d"); err == nil || errors.Is(err, ErrEmpty) || errors.Is(err, fs.ErrNotExist) {
		t.Errorf("torn record: %v, want a decode error", err)
	}
	if ids, err := r.IDs(); err != nil || !slices.Equal(ids, []string{"a", "b", "c", "d"}) {
		t.Errorf("IDs %v %v", ids, err)
	}
}

func TestRecordsRenameLegacy(t *testing.T) {
	var renamed []string
	r := Records[thing]{Dir: t.TempDir(), File: "thing.json", Legacy: []string{"old.json"},
		Renamed: func(id, legacy string) { renamed = append(renamed, id+"/"+legacy) }}
	for _, id := range []string{"a", "b", "c"} {
		if err := os.Mkdir(r.ObjectDir(id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(id, name, data string) {
		if err := os.WriteFile(filepath.Join(r.ObjectDir(id), name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a", "old.json", `{"id":"a","group":"old"}`)
	write("b", "old.json", `{"id":"b","group":"old"}`)
	write("b", "thing.json", `{"id":"b","group":"new"}`) // both: the current name wins
	write("c", "old.json", "")                           // empty: left for the caller to remove

	got, err := r.Load("a")
	if err != nil || got.Group != "old" {
		t.Fatalf("Load of a legacy record: %+v %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(r.ObjectDir("a"), "old.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("legacy file kept: %v", err)
	}
	if got, err := r.Load("a"); err != nil || got.Group != "old" {
		t.Errorf("Load after the rename: %+v %v", got, err)
	}
	if got, err := r.Load("b"); err != nil || got.Group != "new" {
		t.Errorf("Load with both names: %+v %v", got, err)
	}
	if _, err := r.Load("c"); !errors.Is(err, ErrEmpty) {
		t.Errorf("empty legacy record: %v, want ErrEmpty", err)
	}
	if !slices.Equal(renamed, []string{"a/old.json"}) {
		t.Errorf("renamed %v", renamed)
	}
}
