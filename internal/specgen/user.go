package specgen

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	pathrs "github.com/cyphar/filepath-securejoin/pathrs-lite"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// maxID is runc's limit for a uid or gid.
const maxID = math.MaxInt32

// applyUser resolves the process user and its groups.
func applyUser(in *Input, s *specs.Spec) error {
	u, err := resolveUser(in)
	if err != nil {
		return err
	}
	s.Process.User = u
	return nil
}

// resolveUser picks the user string as containerd does (RunAsUsername,
// else RunAsUser, with ":RunAsGroup"; else the image USER; else root),
// resolves it in the rootfs, then adds supplementary groups per the
// SupplementalGroupsPolicy.
func resolveUser(in *Input) (specs.User, error) {
	sc := in.Config.GetLinux().GetSecurityContext()
	var userPart, groupPart string
	switch {
	case sc.GetRunAsUsername() != "":
		userPart = sc.GetRunAsUsername()
	case sc.GetRunAsUser() != nil:
		v := sc.GetRunAsUser().GetValue()
		if v < 0 || v > maxID {
			return specs.User{}, invalid("run_as_user %d out of range", v)
		}
		userPart = strconv.FormatInt(v, 10)
	}
	if sc.GetRunAsGroup() != nil {
		if userPart == "" {
			return specs.User{}, invalid("run_as_group is set without run_as_user or run_as_username")
		}
		v := sc.GetRunAsGroup().GetValue()
		if v < 0 || v > maxID {
			return specs.User{}, invalid("run_as_group %d out of range", v)
		}
		groupPart = strconv.FormatInt(v, 10)
	}
	if userPart == "" && in.Image.Config.User != "" {
		var hasGroup bool
		userPart, groupPart, hasGroup = strings.Cut(in.Image.Config.User, ":")
		if userPart == "" || (hasGroup && groupPart == "") || strings.Contains(groupPart, ":") {
			return specs.User{}, invalid("image USER %q is not name, uid, name:group or uid:gid", in.Image.Config.User)
		}
	}
	if userPart == "" {
		userPart = "0"
	}

	db := &userDB{root: in.RootfsPath}
	u, err := db.lookup(userPart, groupPart)
	if err != nil {
		return specs.User{}, err
	}

	var extra []uint32
	switch p := sc.GetSupplementalGroupsPolicy(); p {
	case runtime.SupplementalGroupsPolicy_Merge:
		// Groups whose member list names the user, as containerd's
		// WithAdditionalGIDs (by the user's name; a uid not in passwd has none).
		name := userPart
		if _, err := parseID(userPart); err == nil {
			if name, err = db.nameOf(u.UID); err != nil {
				return specs.User{}, err
			}
		}
		if name != "" {
			gids, err := db.memberOf(name)
			if err != nil {
				return specs.User{}, err
			}
			extra = append(extra, gids...)
		}
	case runtime.SupplementalGroupsPolicy_Strict:
	default:
		return specs.User{}, invalid("unknown supplemental_groups_policy %d", p)
	}
	for _, g := range sc.GetSupplementalGroups() {
		if g < 0 || g > maxID {
			return specs.User{}, invalid("supplemental group %d out of range", g)
		}
		extra = append(extra, uint32(g))
	}
	// The primary gid is listed too, as containerd does, so that the
	// container status reports it among the supplementary groups.
	gids := append([]uint32{u.GID}, extra...)
	slices.Sort(gids)
	u.AdditionalGids = slices.Compact(gids)
	return u, nil
}

// The image's /etc/passwd and /etc/group are hostile input: each is
// refused above maxUserDBSize bytes or with a line above maxUserDBLine,
// and is scanned line by line for what the lookup needs, never split into
// entries or member lists, so that memory stays one line's buffer however
// the file is built (1 MiB of "a,a,a,…" would be 8 MiB of string headers
// split; CVE-2026-47262, CVE-2025-4437).
const (
	maxUserDBSize = 16 << 20
	maxUserDBLine = 1 << 20
)

// userDB looks users and groups up in a rootfs's /etc/passwd and
// /etc/group, scanning the file for each lookup.
type userDB struct {
	root string
	buf  []byte // the line buffer, shared by the scans
	// uidName is the passwd name of uidNamed, when lookup scanned for it.
	uidNamed bool
	uidName  string
}

// lookup resolves user ("name" or "uid") and optional group ("name" or
// "gid"). A numeric uid missing from passwd runs with gid 0 (containerd);
// a name must exist. A string that is a number (what ImageStatus reports
// as a uid) is never looked up as a name, so that "-1" or "4294967296"
// cannot become a passwd name mapped to root (CVE-2026-46680).
func (db *userDB) lookup(user, group string) (specs.User, error) {
	var u specs.User
	if uid, err := parseID(user); err == nil {
		u.UID = uid
		if group == "" {
			name, _, gid, ok, err := db.findUser(func(_ string, id uint32) bool { return id == uid })
			if err != nil {
				return u, err
			}
			if ok {
				u.GID = gid
			}
			db.uidNamed, db.uidName = true, name
		}
	} else if errors.Is(err, errOutOfRange) {
		return u, invalid("uid %q out of range", user)
	} else {
		_, uid, gid, ok, err := db.findUser(func(name string, _ uint32) bool { return name == user })
		if err != nil {
			return u, err
		}
		if !ok {
			return u, invalid("user %q not found in the image's /etc/passwd", user)
		}
		u.UID, u.GID = uid, gid
	}
	if group == "" {
		return u, nil
	}
	if gid, err := parseID(group); err == nil {
		u.GID = gid
		return u, nil
	} else if errors.Is(err, errOutOfRange) {
		return u, invalid("gid %q out of range", group)
	}
	found := false
	err := db.scan("/etc/group", func(f *[4][]byte, n int) bool {
		if n < 3 || string(f[0]) != group {
			return false
		}
		gid, err := parseID(string(f[2]))
		if err != nil {
			return false
		}
		u.GID, found = gid, true
		return true
	})
	if err != nil {
		return u, err
	}
	if !found {
		return u, invalid("group %q not found in the image's /etc/group", group)
	}
	return u, nil
}

// findUser is the name, uid and gid of the first valid passwd entry
// match accepts.
func (db *userDB) findUser(match func(name string, uid uint32) bool) (name string, uid, gid uint32, ok bool, err error) {
	err = db.scan("/etc/passwd", func(f *[4][]byte, n int) bool {
		if n < 4 || len(f[0]) == 0 {
			return false
		}
		gidField, _, _ := bytes.Cut(f[3], []byte{':'})
		u, err1 := parseID(string(f[2]))
		g, err2 := parseID(string(gidField))
		if err1 != nil || err2 != nil || !match(string(f[0]), u) {
			return false
		}
		name, uid, gid, ok = string(f[0]), u, g, true
		return true
	})
	return name, uid, gid, ok, err
}

// nameOf is the passwd name of uid, or "": what lookup found, else a scan.
func (db *userDB) nameOf(uid uint32) (string, error) {
	if db.uidNamed {
		return db.uidName, nil
	}
	name, _, _, _, err := db.findUser(func(_ string, id uint32) bool { return id == uid })
	return name, err
}

// memberOf is the gids of the groups, other than one named name, whose
// member list names name (containerd's WithAdditionalGIDs).
func (db *userDB) memberOf(name string) ([]uint32, error) {
	var gids []uint32
	err := db.scan("/etc/group", func(f *[4][]byte, n int) bool {
		if n < 4 || len(f[0]) == 0 || string(f[0]) == name {
			return false
		}
		members, _, _ := bytes.Cut(f[3], []byte{':'})
		if !hasMember(members, name) {
			return false
		}
		if gid, err := parseID(string(f[2])); err == nil && !slices.Contains(gids, gid) {
			gids = append(gids, gid)
		}
		return false
	})
	return gids, err
}

// hasMember reports whether the comma-separated list names name.
func hasMember(list []byte, name string) bool {
	for len(list) > 0 {
		var m []byte
		m, list, _ = bytes.Cut(list, []byte{','})
		if string(m) == name {
			return true
		}
	}
	return false
}

var (
	errOutOfRange = errors.New("id out of range")
	errNotNumber  = errors.New("not a number")
)

// parseID parses a decimal uid/gid within runc's range. Anything that
// strconv.ParseInt reads as a number (a sign, then digits) is a number:
// negative or above maxID it is errOutOfRange, never a name.
func parseID(s string) (uint32, error) {
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	if s == "" {
		return 0, errNotNumber
	}
	var v uint64
	over := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, errNotNumber
		}
		if v > maxID {
			over = true
			continue
		}
		v = v*10 + uint64(c-'0')
	}
	if over || v > maxID || (neg && v != 0) {
		return 0, errOutOfRange
	}
	return uint32(v), nil
}

// scan calls fn with the colon-separated fields of each line of the file
// at name inside the rootfs (the fourth field holds the rest of the
// line), until fn returns true. A missing file (or no rootfs) is empty:
// images without /etc/passwd run numeric users fine. The fields alias
// the line buffer: fn must copy what it keeps.
func (db *userDB) scan(name string, fn func(f *[4][]byte, n int) bool) error {
	if db.root == "" {
		return nil
	}
	h, err := pathrs.OpenInRoot(db.root, name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("open %s in rootfs: %w", name, err)
	}
	defer h.Close()
	// Only a regular file: a FIFO planted by the image would block the open.
	st, err := h.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return invalid("%s in the image is not a regular file", name)
	}
	if st.Size() > maxUserDBSize {
		return invalid("%s in the image is %d bytes, over the limit of %d", name, st.Size(), maxUserDBSize)
	}
	f, err := pathrs.Reopen(h, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open %s in rootfs: %w", name, err)
	}
	defer f.Close()
	// One line, and its newline, fits the buffer; a file shorter than a
	// line needs no more than itself.
	if need := int(min(st.Size(), maxUserDBLine)) + 1; len(db.buf) < need {
		db.buf = make([]byte, need)
	}
	buf := db.buf
	r := io.LimitReader(f, maxUserDBSize)
	var fields [4][]byte
	line := func(l []byte) bool {
		l = bytes.TrimSpace(l)
		if len(l) == 0 || l[0] == '#' {
			return false
		}
		return fn(&fields, splitFields(l, &fields))
	}
	held := 0
	for {
		n, rerr := r.Read(buf[held:])
		held += n
		start := 0
		for {
			i := bytes.IndexByte(buf[start:held], '\n')
			if i < 0 {
				break
			}
			if line(buf[start : start+i]) {
				return nil
			}
			start += i + 1
		}
		held = copy(buf, buf[start:held])
		if errors.Is(rerr, io.EOF) {
			if held > 0 {
				line(buf[:held])
			}
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("read %s in rootfs: %w", name, rerr)
		}
		if held == len(buf) {
			return invalid("%s in the image has a line over %d bytes", name, maxUserDBLine)
		}
	}
}

// splitFields cuts line at its first three colons into f and says how
// many fields it found; the last holds the rest of the line.
func splitFields(line []byte, f *[4][]byte) int {
	n := 0
	for n < len(f)-1 {
		field, rest, ok := bytes.Cut(line, []byte{':'})
		f[n] = field
		n++
		if !ok {
			return n
		}
		line = rest
	}
	f[n] = line
	return n + 1
}
