package image

import (
	"archive/tar"
	"fmt"
	"hash/fnv"
	"path"
	"sync"

	"golang.org/x/sys/unix"
)

// The unpacker's parallel writers of small regular files, and the buffers
// they are handed (unpack.go decides what may go to them).

type fileJob struct {
	hdr    *tar.Header
	target string
	data   []byte
}

// Parallel small-file writes: how many writers, up to what size a file's
// data is read into memory and handed to them, and how many bytes may
// wait for them. Creating names in one directory is serialized by the
// kernel (the directory's lock), and a tar lists a directory's files
// together, so each writer takes whole directories (by a hash of the
// parent's path) and the reader runs ahead by up to parallelBytes, over
// many directories.
const (
	fileWriters     = 4
	maxParallelFile = 256 << 10
	parallelBytes   = 8 << 20
)

// bufPool recycles the data buffers of small files within one unpack, by
// power-of-two size class: a layer of 15 000 small files would otherwise
// allocate (and zero) its whole size again, and keep the garbage
// collector busy. What it holds is bounded by parallelBytes (at most
// twice that, for the rounding up) plus one buffer per class.
type bufPool struct {
	mu   sync.Mutex // guards free
	free [bufClasses][][]byte
}

// Size classes: 4 KiB << i, up to maxParallelFile.
const (
	minBufShift = 12
	bufClasses  = 7 // 4 KiB … 256 KiB
)

func bufClass(n int) int {
	c := 0
	for (minBufShift+c) < 63 && 1<<(minBufShift+c) < n {
		c++
	}
	return c
}

// get returns a buffer of length n (≤ maxParallelFile); its content is
// whatever it held before.
func (p *bufPool) get(n int) []byte {
	c := bufClass(n)
	p.mu.Lock()
	if l := len(p.free[c]); l > 0 {
		b := p.free[c][l-1]
		p.free[c] = p.free[c][:l-1]
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]byte, n, 1<<(minBufShift+c))
}

func (p *bufPool) put(b []byte) {
	c := bufClass(cap(b))
	if c >= bufClasses || cap(b) != 1<<(minBufShift+c) {
		return
	}
	p.mu.Lock()
	p.free[c] = append(p.free[c], b[:0])
	p.mu.Unlock()
}

// dispatch hands a small regular file whose data is in job to a writer.
func (u *unpacker) dispatch(rel string, job fileJob) {
	if u.queues == nil {
		u.queues = make([]chan fileJob, fileWriters)
		for i := range u.queues {
			u.queues[i] = make(chan fileJob, 256)
			u.writers.Add(1)
			go u.write(u.queues[i])
		}
	}
	u.pending[rel] = true
	u.made(rel)
	h := fnv.New32a()
	h.Write([]byte(path.Dir(rel)))
	u.queues[h.Sum32()%fileWriters] <- job
}

func (u *unpacker) write(jobs chan fileJob) {
	defer u.writers.Done()
	for job := range jobs {
		err := u.writeSmall(job)
		u.inFlight.Release(int64(len(job.data)))
		u.bufs.put(job.data)
		if err != nil {
			u.errMu.Lock()
			if u.err == nil {
				u.err = fmt.Errorf("layer %s: entry %q: %w", u.layer, job.hdr.Name, err)
			}
			u.errMu.Unlock()
		}
	}
}

func (u *unpacker) writeSmall(job fileJob) error {
	fd, err := createExcl(job.target)
	if err != nil {
		return err
	}
	if err := writeAll(fd, job.data); err != nil {
		unix.Close(fd)
		return err
	}
	return finishFile(fd, job.hdr, u.drop)
}

// writeErr is the first error of a writer, if any.
func (u *unpacker) writeErr() error {
	u.errMu.Lock()
	defer u.errMu.Unlock()
	return u.err
}

// flush waits until every file handed to the writers is written.
func (u *unpacker) flush() error {
	if u.queues != nil {
		for _, q := range u.queues {
			close(q)
		}
		u.writers.Wait()
		u.queues = nil
	}
	clear(u.pending)
	return u.writeErr()
}
