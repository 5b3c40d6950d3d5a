package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Space is the free space of the file system holding a store.
type Space struct {
	Free  int64 // bytes available (to unprivileged users)
	Total int64 // size of the file system
}

// DefaultReserve is the size of the reserve file (Options.Reserve).
const DefaultReserve = 4 << 20

const reserveFile = "reserve"

// Space measures the free space of the store's file system (statfs: cheap
// enough to call every maintenance period).
func (s *Store) Space() (Space, error) {
	free, total, err := statfs(s.dir)
	if err != nil {
		return Space{}, fmt.Errorf("store: statfs %s: %w", s.dir, err)
	}
	return Space{Free: free, Total: total}, nil
}

// noSpace reports whether err is a full disk or quota.
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// writeZeros fills f with n zero bytes from offset 0.
func writeZeros(f *os.File, n int64) error {
	for off := int64(0); off < n; {
		c := min(n-off, walChunk)
		if _, err := f.WriteAt(zeroChunk[:c], off); err != nil {
			return err
		}
		off += c
	}
	return nil
}

// The reserve file (dir/reserve, up to Options.Reserve bytes) is space the
// store holds back for its own housekeeping on a full disk: replaying the
// log at Open, a new log file, a checkpoint (bbolt pages), which is what
// lets deletes free space. Without it a store filled to the last byte
// could neither restart nor take the updates that would empty it. When
// one of those steps fails for lack of space the reserve is deleted and
// the step retried. After every checkpoint (which deletes the log files
// it covers) and at Close the reserve is topped up from free space, as
// much as there is: a store that used its reserve takes back the space
// its own checkpoints free, and can restart even if the disk is then
// filled to the last byte.

// minReserve is the smallest reserve worth keeping: room for a small log.
const minReserve = 256 << 10

func (s *Store) reservePath() string { return filepath.Join(s.dir, reserveFile) }

// makeReserve creates or tops up the reserve file: Options.Reserve bytes,
// or on a nearly full disk as many as it can get (halving down to
// minReserve); with less the store goes without one.
func (s *Store) makeReserve() {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	if s.reserve <= 0 {
		os.Remove(s.reservePath()) // one made before, when a reserve was wanted
		return
	}
	if s.hasReserve && s.resSize >= s.reserve {
		return
	}
	var cur int64
	if st, err := os.Stat(s.reservePath()); err == nil {
		cur = st.Size()
	}
	if sp, err := s.Space(); err == nil && sp.Free < minReserve && cur == 0 {
		return // nothing to take (and no file to make and remove each time)
	}
	got := cur
	f, err := os.OpenFile(s.reservePath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err == nil {
		for n := s.reserve; n > cur && n >= minReserve; n /= 2 {
			if err = allocate(f, n); err == nil || !noSpace(err) {
				if err == nil {
					got = n
				}
				break
			}
		}
		if noSpace(err) {
			err = nil // as much as there was
		}
		if err == nil {
			err = f.Truncate(got) // a failed allocation may have left some
		}
		if err == nil && got > cur && !s.noSync {
			err = fdatasync(f)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil && cur == 0 && got > 0 {
		err = s.syncDir(s.dir)
	}
	if err != nil || got < minReserve {
		os.Remove(s.reservePath())
		if s.hasReserve || !s.resWarned {
			s.log.Warn("store: no reserve space for housekeeping on a full disk", "want", s.reserve, "err", err)
			s.resWarned = true
		}
		s.hasReserve, s.resSize = false, 0
		return
	}
	s.hasReserve, s.resSize, s.resWarned = true, got, false
}

// releaseReserve deletes the reserve file; it reports whether there was
// one (whether retrying a step that failed for lack of space may help).
func (s *Store) releaseReserve() bool {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	if !s.hasReserve {
		return false
	}
	s.hasReserve = false
	if err := os.Remove(s.reservePath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("store: cannot release the reserve file", "err", err)
		return false
	}
	s.log.Warn("store: disk full; released the reserve for housekeeping", "bytes", s.resSize)
	s.resSize = 0
	return true
}

// withReserve runs f, and once more after releasing the reserve if it
// failed for lack of space. f must be safe to repeat.
func (s *Store) withReserve(f func() error) error {
	err := f()
	if noSpace(err) && s.releaseReserve() {
		err = f()
	}
	return err
}
