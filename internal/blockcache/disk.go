package blockcache

import (
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// touchEvery is how stale a file's mtime may get before a hit refreshes it:
// the mtime only orders the LRU after a restart, so it need not be exact,
// and most hits then cost no metadata write.
const touchEvery = 10 * time.Minute

// queueLen bounds the blocks waiting for the disk writer (64 KiB blocks:
// at most 16 MiB pinned).
const queueLen = 256

// tmpSuffix marks a block being written; leftovers of a crash are removed
// at open.
const tmpSuffix = ".tmp"

// DefaultMaxAge is how long a block may go unused before the disk tier
// drops it, whatever room is left: blocks of files deleted or rewritten
// elsewhere are never asked for again, and should not hold disk space
// until the byte bound pushes them out.
const DefaultMaxAge = 72 * time.Hour

// freeShare is the largest share of the space available to the cache (its
// own files plus the file system's free space, at open) that it takes:
// a full disk costs the servers and applications more than cache misses.
const freeShare = 0.5

// Disk is a byte-bounded LRU of blocks in a directory, one file per block
// named by its hex hash under a subdirectory named by the hash's first
// byte. Writes go through a bounded queue to one background writer; every
// read re-verifies the hash, so a torn or rotted file is a miss, never bad
// data. It is safe for concurrent use.
type Disk struct {
	dir    string
	limit  int64
	maxAge time.Duration
	log    *slog.Logger

	mu      sync.Mutex
	used    int64
	ll      *list.List // front = most recently used
	items   map[Hash]*list.Element
	pending map[Hash]bool // queued, not yet written
	// owners maps a file (ForgetOwner's argument) to the blocks cached on
	// its behalf; forget holds queued blocks to drop once written.
	owners  map[uint64]map[Hash]struct{}
	forget  map[Hash]bool
	written *sync.Cond // signalled as pending shrinks
	closed  bool
	stats   DiskStats

	queue chan job
	done  chan struct{}
	stop  chan struct{} // ends the age sweeper
	swept chan struct{}
}

type diskItem struct {
	hash    Hash
	size    int64
	touched time.Time // the file's mtime as last set or seen
	used    time.Time // last use (in memory; the mtime is refreshed less often)
	owner   uint64    // 0: none
}

type job struct {
	hash  Hash
	data  []byte
	owner uint64
}

// DiskStats counts the disk tier's activity since open.
type DiskStats struct {
	Hits, Misses uint64
	// Written blocks, Skipped ones (queue full), Evicted (by the bound or
	// by age), Forgotten (their file was deleted) and Corrupt files.
	Written, Skipped, Evicted, Forgotten, Corrupt uint64
	// Limit is the byte bound in force (the configured one, or less when
	// free disk space is short).
	Limit int64
	Used  int64
	Files int
}

// OpenDisk opens (creating it if needed) the block directory dir, bounded
// by limit bytes (but by no more than half of the space available to it:
// its own files plus the file system's free space) and by DefaultMaxAge.
// It removes leftover temporary files and rebuilds the LRU order from the
// files' modification times, evicting beyond the bounds.
func OpenDisk(dir string, limit int64, log *slog.Logger) (*Disk, error) {
	return OpenDiskAge(dir, limit, DefaultMaxAge, log)
}

// OpenDiskAge is OpenDisk with blocks unused for maxAge dropped (checked
// every maxAge/8, at least every hour; maxAge <= 0 turns it off).
func OpenDiskAge(dir string, limit int64, maxAge time.Duration, log *slog.Logger) (*Disk, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("blockcache: %w", err)
	}
	// Cached blocks are readable file data: other local users must not
	// see them, whoever created the directory.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("blockcache: %w", err)
	}
	d := &Disk{
		dir: dir, limit: limit, maxAge: maxAge, log: log.With("component", "blockcache", "dir", dir),
		ll: list.New(), items: make(map[Hash]*list.Element), pending: make(map[Hash]bool),
		owners: make(map[uint64]map[Hash]struct{}), forget: make(map[Hash]bool),
		queue: make(chan job, queueLen), done: make(chan struct{}),
		stop: make(chan struct{}), swept: make(chan struct{}),
	}
	d.written = sync.NewCond(&d.mu)
	found, err := d.scan()
	if err != nil {
		return nil, err
	}
	slices.SortFunc(found, func(a, b diskItem) int { return b.touched.Compare(a.touched) })
	for _, it := range found {
		it.used = it.touched
		d.items[it.hash] = d.ll.PushBack(&it)
		d.used += it.size
	}
	if free, ok := freeBytes(dir); ok {
		if capped := int64(freeShare * float64(free+d.used)); capped < d.limit {
			d.log.Info("disk cache bound lowered to half the space available", "configured", d.limit,
				"limit", capped, "free", free)
			d.limit = max(capped, 0)
		}
	}
	d.remove(d.evictLocked())
	d.remove(d.expireLocked(time.Now()))
	go d.writer()
	go d.sweeper()
	return d, nil
}

// sweeper drops blocks unused for maxAge, every maxAge/8 (at most hourly).
func (d *Disk) sweeper() {
	defer close(d.swept)
	if d.maxAge <= 0 {
		return
	}
	tk := time.NewTicker(min(d.maxAge/8, time.Hour))
	defer tk.Stop()
	for {
		select {
		case <-d.stop:
			return
		case now := <-tk.C:
			d.mu.Lock()
			victims := d.expireLocked(now)
			d.mu.Unlock()
			d.remove(victims)
		}
	}
}

// expireLocked drops the blocks unused since now-maxAge, oldest first, and
// returns them; their files are removed outside the lock. Files are only
// removed by the writer and by callers holding no lock on the way, so a
// block rewritten meanwhile is not lost: it is just missing (a miss).
func (d *Disk) expireLocked(now time.Time) []Hash {
	if d.maxAge <= 0 {
		return nil
	}
	var victims []Hash
	for e := d.ll.Back(); e != nil; e = d.ll.Back() {
		it := e.Value.(*diskItem)
		if now.Sub(it.used) <= d.maxAge {
			break
		}
		victims = append(victims, it.hash)
		d.dropLocked(e)
		d.stats.Evicted++
	}
	return victims
}

// ForgetOwner drops the blocks cached on behalf of owner (PutOwned), as
// when the file they came from was deleted. A block the file shared with
// others is dropped too: that costs a later miss, nothing more.
func (d *Disk) ForgetOwner(owner uint64) (forgotten []Hash) {
	d.mu.Lock()
	var victims []Hash
	for h := range d.owners[owner] {
		forgotten = append(forgotten, h)
		if e, ok := d.items[h]; ok {
			victims = append(victims, h)
			d.dropLocked(e)
			d.stats.Forgotten++
		} else if d.pending[h] {
			d.forget[h] = true
		}
	}
	delete(d.owners, owner)
	d.mu.Unlock()
	d.remove(victims)
	return forgotten
}

// scan lists the blocks in the directory and removes temporary leftovers.
func (d *Disk) scan() ([]diskItem, error) {
	shards, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("blockcache: %w", err)
	}
	var found []diskItem
	for _, sh := range shards {
		if !sh.IsDir() || len(sh.Name()) != 2 {
			continue
		}
		sdir := filepath.Join(d.dir, sh.Name())
		ents, err := os.ReadDir(sdir)
		if err != nil {
			return nil, fmt.Errorf("blockcache: %w", err)
		}
		for _, e := range ents {
			name := e.Name()
			if strings.HasSuffix(name, tmpSuffix) {
				if err := os.Remove(filepath.Join(sdir, name)); err != nil {
					d.log.Warn("cannot remove temporary file", "file", name, "err", err)
				}
				continue
			}
			var h Hash
			if n, err := hex.Decode(h[:], []byte(name)); err != nil || n != len(h) || len(name) != 2*len(h) ||
				!strings.HasPrefix(name, sh.Name()) {
				continue // not ours
			}
			info, err := e.Info()
			if err != nil || !info.Mode().IsRegular() {
				continue
			}
			found = append(found, diskItem{hash: h, size: info.Size(), touched: info.ModTime()})
		}
	}
	return found, nil
}

func (d *Disk) path(h Hash) string {
	name := hex.EncodeToString(h[:])
	return filepath.Join(d.dir, name[:2], name)
}

// Get returns the block stored under h, verifying its hash. A corrupt file
// is removed and reported as a miss.
func (d *Disk) Get(h Hash) ([]byte, bool) {
	d.mu.Lock()
	e, ok := d.items[h]
	d.mu.Unlock()
	if !ok {
		d.count(func(s *DiskStats) { s.Misses++ })
		return nil, false
	}
	p := d.path(h)
	data, err := os.ReadFile(p)
	if err != nil || sha256.Sum256(data) != h {
		if err == nil {
			d.log.Warn("corrupt cached block removed", "hash", hex.EncodeToString(h[:]), "size", len(data))
			os.Remove(p)
		} else if !errors.Is(err, fs.ErrNotExist) {
			d.log.Warn("cannot read cached block", "err", err)
		}
		d.mu.Lock()
		if cur, ok := d.items[h]; ok && cur == e {
			d.dropLocked(e)
		}
		d.stats.Misses++
		if err == nil {
			d.stats.Corrupt++
		}
		d.mu.Unlock()
		return nil, false
	}
	now := time.Now()
	d.mu.Lock()
	d.stats.Hits++
	touch := false
	if cur, ok := d.items[h]; ok && cur == e {
		d.ll.MoveToFront(e)
		it := e.Value.(*diskItem)
		it.used = now
		if now.Sub(it.touched) > touchEvery {
			it.touched, touch = now, true
		}
	}
	d.mu.Unlock()
	if touch {
		os.Chtimes(p, time.Time{}, now) // best effort: it only orders the next open
	}
	return data, true
}

// Put queues data to be stored under h, unless it is stored or queued
// already. If the queue is full the block is skipped: this is a cache. The
// Disk keeps data until written: callers must not modify it.
func (d *Disk) Put(h Hash, data []byte) { d.PutOwned(0, h, data) }

// PutOwned is Put on behalf of owner (a file), so that ForgetOwner(owner)
// can drop the block; 0 is no owner.
func (d *Disk) PutOwned(owner uint64, h Hash, data []byte) {
	if int64(len(data)) > d.limit {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.pending[h] {
		return
	}
	if _, ok := d.items[h]; ok {
		return
	}
	select {
	case d.queue <- job{h, data, owner}:
		d.pending[h] = true
		if owner != 0 { // known from now on, so that ForgetOwner can cancel the write
			if d.owners[owner] == nil {
				d.owners[owner] = make(map[Hash]struct{})
			}
			d.owners[owner][h] = struct{}{}
		}
	default:
		d.stats.Skipped++
	}
}

// writer writes queued blocks in order until Close.
func (d *Disk) writer() {
	defer close(d.done)
	made := map[string]bool{}
	for j := range d.queue {
		d.mu.Lock()
		skip := d.forget[j.hash]
		d.mu.Unlock()
		var err error
		if !skip { // its file was deleted while it was queued: not worth writing
			err = d.write(j, made)
		}
		d.mu.Lock()
		delete(d.pending, j.hash)
		d.written.Broadcast()
		var victims []Hash
		switch _, ok := d.items[j.hash]; {
		case err != nil:
			d.log.Warn("cannot write cached block", "err", err)
		case d.forget[j.hash]:
			if !skip {
				victims = append(victims, j.hash)
			}
			d.stats.Forgotten++
		case !ok:
			now := time.Now()
			d.items[j.hash] = d.ll.PushFront(&diskItem{hash: j.hash, size: int64(len(j.data)), touched: now, used: now, owner: j.owner})
			d.used += int64(len(j.data))
			d.stats.Written++
			victims = d.evictLocked()
		}
		delete(d.forget, j.hash)
		if _, ok := d.items[j.hash]; !ok { // not stored after all
			d.dropOwnerLocked(j.owner, j.hash)
		}
		d.mu.Unlock()
		// Only this goroutine writes files, so no new copy of a victim can
		// appear before it is removed.
		d.remove(victims)
	}
}

// write stores one block through a temporary file and a rename, so a
// block's final name never holds a partial write. No fsync: a block lost
// or torn by a crash fails its hash check and is a miss.
func (d *Disk) write(j job, made map[string]bool) error {
	p := d.path(j.hash)
	sdir := filepath.Dir(p)
	if !made[sdir] {
		if err := os.MkdirAll(sdir, 0o700); err != nil {
			return err
		}
		made[sdir] = true
	}
	f, err := os.CreateTemp(sdir, filepath.Base(p)+".*"+tmpSuffix) // mode 0600
	if err != nil {
		return err
	}
	_, err = f.Write(j.data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// evictLocked drops least recently used entries until the bound holds and
// returns them; their files are removed outside the lock.
func (d *Disk) evictLocked() []Hash {
	var victims []Hash
	for d.used > d.limit {
		last := d.ll.Back()
		victims = append(victims, last.Value.(*diskItem).hash)
		d.dropLocked(last)
		d.stats.Evicted++
	}
	return victims
}

func (d *Disk) dropLocked(e *list.Element) {
	it := e.Value.(*diskItem)
	d.ll.Remove(e)
	delete(d.items, it.hash)
	d.used -= it.size
	d.dropOwnerLocked(it.owner, it.hash)
}

func (d *Disk) dropOwnerLocked(owner uint64, h Hash) {
	if set := d.owners[owner]; set != nil {
		delete(set, h)
		if len(set) == 0 {
			delete(d.owners, owner)
		}
	}
}

func (d *Disk) remove(hashes []Hash) {
	for _, h := range hashes {
		if err := os.Remove(d.path(h)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			d.log.Warn("cannot remove evicted block", "err", err)
		}
	}
}

func (d *Disk) count(f func(*DiskStats)) {
	d.mu.Lock()
	f(&d.stats)
	d.mu.Unlock()
}

// Stats reports the disk tier's counters.
func (d *Disk) Stats() DiskStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats
	s.Used, s.Files, s.Limit = d.used, len(d.items), d.limit
	return s
}

// Flush waits until every block queued so far is written (or failed).
func (d *Disk) Flush() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.pending) > 0 {
		d.written.Wait()
	}
}

// Close writes the queued blocks and stops the writer. Get still works
// afterwards; Put does nothing. Close is idempotent.
func (d *Disk) Close() error {
	d.mu.Lock()
	if !d.closed {
		d.closed = true
		close(d.queue)
		close(d.stop)
	}
	d.mu.Unlock()
	<-d.done
	<-d.swept
	return nil
}
