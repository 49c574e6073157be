package objstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/berthcri/berth/internal/atomicfile"
)

// ErrEmpty is a record file with nothing in it: what a power loss leaves
// of a first write whose deferred fsync had not run yet (decision 1600).
// Nothing else writes one.
var ErrEmpty = errors.New("empty record")

// Records keeps one record per object on disk, as JSON in
// <Dir>/<id>/<File>, each write replacing the file atomically. The
// object's directory holds whatever else the kind keeps for it.
type Records[R any] struct {
	// Dir holds a directory per object, named by its ID.
	Dir string
	// File is the record's name in an object's directory.
	File string
	// Legacy are names File had before. Load finds a record under one of
	// them when File is missing and renames it to File (a node upgraded
	// in place keeps its objects).
	Legacy []string
	// Renamed, if set, hears of each record Load renamed from a Legacy
	// name.
	Renamed func(id, legacy string)
	// Indent writes records indented, for people reading them.
	Indent bool
	// Deferred writes SaveSoon's records (decision 1600); nil writes them
	// as Save does.
	Deferred *atomicfile.Deferred
}

// ObjectDir is the directory of object id.
func (r *Records[R]) ObjectDir(id string) string { return filepath.Join(r.Dir, id) }

// Path is the record file of object id.
func (r *Records[R]) Path(id string) string { return filepath.Join(r.Dir, id, r.File) }

// Save replaces object id's record durably (atomicfile.Write).
func (r *Records[R]) Save(id string, rec *R) error {
	return r.save(id, rec, atomicfile.Write)
}

// SaveSoon replaces object id's record at once and has it made durable
// right after, off the caller's path (Records.Deferred; decision 1600):
// for records whose recovery accepts an older, missing or empty one
// after a power loss (docs/reliability.md says which).
func (r *Records[R]) SaveSoon(id string, rec *R) error {
	return r.save(id, rec, r.Deferred.Write)
}

func (r *Records[R]) save(id string, rec *R, write func(string, []byte, os.FileMode) error) error {
	var data []byte
	var err error
	if r.Indent {
		data, err = json.MarshalIndent(rec, "", "  ")
	} else {
		data, err = json.Marshal(rec)
	}
	if err != nil {
		return fmt.Errorf("encode record of %s: %w", id, err)
	}
	if err := write(r.Path(id), data, 0o600); err != nil {
		return fmt.Errorf("write record of %s: %w", id, err)
	}
	return nil
}

// Load reads object id's record. A missing record is an fs.ErrNotExist
// error, an empty one ErrEmpty. A record found only under a Legacy name
// is renamed to File first.
func (r *Records[R]) Load(id string) (*R, error) {
	rec, err := r.read(r.Path(id))
	if !errors.Is(err, fs.ErrNotExist) {
		return rec, err
	}
	for _, name := range r.Legacy {
		old := filepath.Join(r.Dir, id, name)
		rec, lerr := r.read(old)
		if errors.Is(lerr, fs.ErrNotExist) {
			continue
		}
		if lerr != nil {
			return nil, lerr
		}
		if err := r.migrate(old, r.Path(id)); err != nil {
			return nil, err
		}
		if r.Renamed != nil {
			r.Renamed(id, name)
		}
		return rec, nil
	}
	return nil, err
}

// migrate renames a legacy record file to its current name, durably.
func (r *Records[R]) migrate(old, path string) error {
	if err := os.Rename(old, path); err != nil {
		return fmt.Errorf("migrate record %s: %w", old, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("migrate record %s: %w", old, err)
	}
	return nil
}

func (r *Records[R]) read(path string) (*R, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, ErrEmpty
	}
	rec := new(R)
	if err := json.Unmarshal(data, rec); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return rec, nil
}

// IDs lists the objects that have a directory under Dir, records or
// not, creating Dir if needed.
func (r *Records[R]) IDs() ([]string, error) {
	if err := os.MkdirAll(r.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("create %s: %w", r.Dir, err)
	}
	entries, err := os.ReadDir(r.Dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", r.Dir, err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}
