package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/fserr"
)

// Full disks. Every maintenance round a server measures the free space of
// its data directory's file system (statfs) and judges itself full below
// its reserve (Config.DiskReserve), and no longer full once a quarter of
// the reserve more is free. It publishes both in its registration
// (configsvc.ServerInfo): at once when the verdict changes, otherwise when
// the free space moved by a twentieth of the disk, at most every
// spacePublishEvery — each publication wakes every watcher of the table.
// Placement treats a full server like one that is down, for new data only:
// no new objects, slices or backups go there, a .Site whose servers are
// all full falls back to where the object is created, and maintenance
// moves such slices home once the verdict clears (tend, as after an
// outage of the home site). Writes to what a full server already holds go
// on until the disk itself refuses them (ENOSPC).

// spacePublishEvery bounds how often free space alone is republished.
const spacePublishEvery = 30 * time.Second

// defaultReserveMax caps the default reserve (2% of the file system).
const defaultReserveMax = 512 << 20

type spaceState struct {
	mu        sync.Mutex
	cur       configsvc.ServerInfo // last measured
	published configsvc.ServerInfo // last published
	at        time.Time            // when published
	inflight  bool
}

// reserve is the free space below which the server is full, for a file
// system of total bytes.
func (s *Server) reserve(total int64) int64 {
	if r := s.cfg.DiskReserve; r != 0 {
		return r
	}
	return min(total/50, defaultReserveMax)
}

// measureSpace measures free space and returns this server's registration
// value with it.
func (s *Server) measureSpace() configsvc.ServerInfo {
	info := configsvc.ServerInfo{ID: s.cfg.ID, Site: s.cfg.Site, Addr: s.cfg.Addr}
	sp, err := s.store.Space()
	s.space.mu.Lock()
	if err != nil {
		s.log.Debug("cannot measure free space", "err", err)
	} else {
		info.Free, info.Total = sp.Free, sp.Total
		// A quarter of the reserve as hysteresis: a server hovering at
		// its reserve does not flip (and wake every watcher) each round.
		r := s.reserve(sp.Total)
		info.Full = s.cfg.DiskReserve >= 0 && (sp.Free < r || s.space.cur.Full && sp.Free < r+r/4)
	}
	if info.Full != s.space.cur.Full {
		s.log.Warn("disk full verdict changed", "full", info.Full, "free", info.Free, "reserve", s.reserve(info.Total))
	}
	s.space.cur = info
	if s.space.at.IsZero() { // Start registers with it
		s.space.published, s.space.at = info, time.Now()
	}
	s.space.mu.Unlock()
	return info
}

// selfFull reports this server's own verdict as last measured.
func (s *Server) selfFull() bool {
	s.space.mu.Lock()
	defer s.space.mu.Unlock()
	return s.space.cur.Full
}

// full reports whether server id counts as full: its published verdict,
// or for this server its own last measurement.
func (s *Server) full(id string) bool {
	if id == s.cfg.ID {
		return s.selfFull()
	}
	t := s.table.Load()
	return t != nil && t.Servers[id].Full
}

// publishSpace measures free space and, when due, publishes it in the
// background (bounded by PeerTimeout; one at a time). A verdict that
// changed wakes maintenance here too: this server may have to move its
// slices' new backups elsewhere.
func (s *Server) publishSpace(ctx context.Context) {
	info := s.measureSpace()
	s.space.mu.Lock()
	last := s.space.published
	changed := info.Full != last.Full
	moved := info.Free-last.Free > info.Total/20 || last.Free-info.Free > info.Total/20
	due := changed || moved && time.Since(s.space.at) >= spacePublishEvery
	if !due || s.space.inflight {
		s.space.mu.Unlock()
		return
	}
	s.space.inflight = true
	s.space.mu.Unlock()
	s.tendWG.Add(1)
	go func() {
		defer s.tendWG.Done()
		pctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
		err := s.conf.UpdateServer(pctx, info)
		cancel()
		s.space.mu.Lock()
		s.space.inflight = false
		if err == nil {
			s.space.published, s.space.at = info, time.Now()
		}
		s.space.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("cannot publish free space; retrying", "err", err)
		}
	}()
	if changed {
		s.kick()
	}
}

// noRoom fails a write of r's slice that waits for need copies (this one
// included) when it cannot get them because the servers that could hold
// them are full: the listed backups that are not suspected, plus the
// servers with room that maintenance could recruit, number fewer than
// need−1, and some server is full. Such a write would otherwise wait out
// its whole bound and fail with ETIMEDOUT, as with servers down.
func (s *Server) noRoom(r *sliceRepl, need int) error {
	t := s.table.Load()
	if t == nil || need <= 1 {
		return nil
	}
	r.mu.Lock()
	listed := make(map[string]bool, len(r.followers))
	for id := range r.followers {
		listed[id] = true
	}
	r.mu.Unlock()
	avail, anyFull := 0, false
	for id := range listed {
		if !s.suspected(id) {
			avail++
		}
	}
	for id, si := range t.Servers {
		anyFull = anyFull || si.Full
		if id != s.cfg.ID && !listed[id] && !si.Full && !s.suspected(id) {
			avail++
		}
	}
	if avail >= need-1 || !anyFull {
		return nil
	}
	return fmt.Errorf("slice %d: %d of the %d copies asked for can be made, the other servers are full: %w",
		r.slice, avail+1, need, fserr.ErrNoSpace)
}

// waitBackups waits until need−1 backups have seq (r.wait), failing early
// with ENOSPC once noRoom says they cannot be had.
func (s *Server) waitBackups(ctx context.Context, r *sliceRepl, seq uint64, need int) error {
	if need <= 1 {
		return nil // its own copy is all it waits for: no timer on this path
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, roomCheckEvery)
		err := r.wait(wctx, seq, need-1)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(wctx.Err(), context.DeadlineExceeded) {
			return err
		}
		if err := s.noRoom(r, need); err != nil {
			return err
		}
	}
}

// roomCheckEvery is how often a write waiting for backups checks whether
// full disks make the wait hopeless.
const roomCheckEvery = 250 * time.Millisecond
