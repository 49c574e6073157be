package specgen

import (
	"bufio"
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

// passwdEntry is one line of /etc/passwd; groupEntry one of /etc/group.
type passwdEntry struct {
	name     string
	uid, gid uint32
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
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
		if _, err := strconv.Atoi(userPart); err == nil {
			name = db.nameOf(u.UID)
		}
		if name != "" {
			groups, err := db.groups()
			if err != nil {
				return specs.User{}, err
			}
			for _, g := range groups {
				if g.name != name && slices.Contains(g.members, name) {
					extra = append(extra, g.gid)
				}
			}
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

// userDB reads /etc/passwd and /etc/group inside a rootfs, once each.
type userDB struct {
	root       string
	passwdRead bool
	passwd     []passwdEntry
	groupRead  bool
	group      []groupEntry
}

// lookup resolves user ("name" or "uid") and optional group ("name" or
// "gid"). A numeric uid missing from passwd runs with gid 0 (containerd);
// a name must exist.
func (db *userDB) lookup(user, group string) (specs.User, error) {
	var u specs.User
	if uid, err := parseID(user); err == nil {
		u.UID = uid
		if group == "" {
			users, err := db.users()
			if err != nil {
				return u, err
			}
			for _, e := range users {
				if e.uid == uid {
					u.GID = e.gid
					break
				}
			}
		}
	} else if errors.Is(err, errOutOfRange) {
		return u, invalid("uid %q out of range", user)
	} else {
		users, err := db.users()
		if err != nil {
			return u, err
		}
		i := slices.IndexFunc(users, func(e passwdEntry) bool { return e.name == user })
		if i < 0 {
			return u, invalid("user %q not found in the image's /etc/passwd", user)
		}
		u.UID, u.GID = users[i].uid, users[i].gid
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
	groups, err := db.groups()
	if err != nil {
		return u, err
	}
	i := slices.IndexFunc(groups, func(e groupEntry) bool { return e.name == group })
	if i < 0 {
		return u, invalid("group %q not found in the image's /etc/group", group)
	}
	u.GID = groups[i].gid
	return u, nil
}

// nameOf is the passwd name of uid, or "".
func (db *userDB) nameOf(uid uint32) string {
	users, err := db.users()
	if err != nil {
		return ""
	}
	for _, e := range users {
		if e.uid == uid {
			return e.name
		}
	}
	return ""
}

var errOutOfRange = errors.New("id out of range")

// parseID parses a decimal uid/gid within runc's range.
func parseID(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, errOutOfRange
		}
		return 0, err
	}
	if v > maxID {
		return 0, errOutOfRange
	}
	return uint32(v), nil
}

func (db *userDB) users() ([]passwdEntry, error) {
	if db.passwdRead {
		return db.passwd, nil
	}
	db.passwdRead = true
	err := db.readLines("/etc/passwd", func(f []string) {
		if len(f) < 4 {
			return
		}
		uid, err1 := parseID(f[2])
		gid, err2 := parseID(f[3])
		if f[0] == "" || err1 != nil || err2 != nil {
			return
		}
		db.passwd = append(db.passwd, passwdEntry{name: f[0], uid: uid, gid: gid})
	})
	return db.passwd, err
}

func (db *userDB) groups() ([]groupEntry, error) {
	if db.groupRead {
		return db.group, nil
	}
	db.groupRead = true
	err := db.readLines("/etc/group", func(f []string) {
		if len(f) < 3 {
			return
		}
		gid, err := parseID(f[2])
		if f[0] == "" || err != nil {
			return
		}
		g := groupEntry{name: f[0], gid: gid}
		if len(f) > 3 && f[3] != "" {
			g.members = strings.Split(f[3], ",")
		}
		db.group = append(db.group, g)
	})
	return db.group, err
}

// readLines calls fn with the colon-separated fields of each line of the
// file at name inside the rootfs. A missing file (or no rootfs) is empty:
// images without /etc/passwd run numeric users fine.
func (db *userDB) readLines(name string, fn func([]string)) error {
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
	if st, err := h.Stat(); err != nil || !st.Mode().IsRegular() {
		return invalid("%s in the image is not a regular file", name)
	}
	f, err := pathrs.Reopen(h, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open %s in rootfs: %w", name, err)
	}
	defer f.Close()
	// A hostile image may ship a huge file; a few MiB is plenty.
	sc := bufio.NewScanner(io.LimitReader(f, 16<<20))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fn(strings.Split(line, ":"))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s in rootfs: %w", name, err)
	}
	return nil
}
