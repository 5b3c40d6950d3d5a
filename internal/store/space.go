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

// The reserve file (dir/reserve, Options.Reserve bytes) is space the store
// holds back for its own housekeeping on a full disk: replaying the log at
// Open, and a checkpoint (a new log file and bbolt pages), which is what
// lets deletes free space. Without it a store filled to the last byte
// could neither restart nor take the updates that would empty it. When
// one of those steps fails for lack of space the reserve is deleted and
// the step retried; it is made again after a checkpoint once there is
// room for it twice over.

func (s *Store) reservePath() string { return filepath.Join(s.dir, reserveFile) }

// makeReserve creates the reserve file if it is missing; on a full disk
// the store goes without one (and says so).
func (s *Store) makeReserve() {
	s.resMu.Lock()
	defer s.resMu.Unlock()
	if s.reserve <= 0 {
		return
	}
	if st, err := os.Stat(s.reservePath()); err == nil && st.Size() >= s.reserve {
		s.hasReserve = true
		return
	}
	f, err := os.OpenFile(s.reservePath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err == nil {
		err = allocate(f, s.reserve)
		if err == nil && !s.noSync {
			err = fdatasync(f)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = s.syncDir(s.dir)
	}
	if err != nil {
		os.Remove(s.reservePath())
		s.hasReserve = false
		s.log.Warn("store: no reserve space for housekeeping on a full disk", "bytes", s.reserve, "err", err)
		return
	}
	s.hasReserve = true
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
	s.log.Warn("store: disk full; released the reserve for housekeeping", "bytes", s.reserve)
	return true
}

// restoreReserve makes the reserve file again if it was released and the
// disk has room for it twice over.
func (s *Store) restoreReserve() {
	s.resMu.Lock()
	gone := !s.hasReserve && s.reserve > 0
	s.resMu.Unlock()
	if !gone {
		return
	}
	if sp, err := s.Space(); err != nil || sp.Free < 2*s.reserve {
		return
	}
	s.makeReserve()
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
