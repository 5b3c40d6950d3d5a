package server

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Orphans. A file (or a directory) that loses its last link while open
// stays, with no name, until the handles open on it are gone. Open counts are soft
// state (an open is not a replicated write); the moment an unlink makes
// an orphan, the handles open at the primary are written on the object,
// in the unlink's transaction, as hidden attributes: one per holder,
// \x00orphan/<session>/<handle>, valued with the holder's node. Like the
// outcome records (once.go) they are replicated, snapshotted and installed
// with the object, so the primary after a failover or a restart knows the
// orphan and who holds it.
//
// A holder ends when its handle is released, at whichever server is
// primary then, or when its client session is gone: it sent its bye
// (the client core closed), or for HolderIdle it had no back channel
// attached here and named itself in no request. A primary counts that
// idle time from when it started serving the slice at the earliest, so
// that holders reach a new primary first (the client core keeps a back
// channel to the primary of every file it holds open). The orphan goes
// with its last holder. Opens without a handle (in-process only) hold it
// as one holder named after this process (session 0, its boot number):
// they die with the process.
const orphanPrefix = "\x00orphan/"

// A file a rename replaces is an orphan too, for the rename grace: one
// more holder, \x00orphan/grace/<deadline>, ends at the deadline (unix
// ns, hex). rename(2) promises that the name never goes missing, and a
// reader resolves a name before it opens the object by id, so the
// object must outlive the rename a little: an open by id of a spared
// file succeeds (the old contents, as on a local file system), and the
// opens made so become holders when the grace ends.
const gracePrefix = orphanPrefix + "grace/"

// DefaultRenameGrace is Config.RenameGrace's default: far longer than a
// lookup-to-open gap, even across sites.
const DefaultRenameGrace = 10 * time.Second

func graceKey(deadline time.Time) string {
	return gracePrefix + hex.EncodeToString(binary.BigEndian.AppendUint64(nil, uint64(deadline.UnixNano())))
}

// graceEnd is the deadline of the grace holder name (ok false for any
// other name).
func graceEnd(name string) (deadline time.Time, ok bool) {
	b, err := hex.DecodeString(strings.TrimPrefix(name, gracePrefix))
	if err != nil || len(b) != 8 || !strings.HasPrefix(name, gracePrefix) {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(b))), true
}

// inGrace reports whether orphan id is a replaced file still in its
// rename grace at now.
func inGrace(tx *store.Tx, id oid.ID, now time.Time) bool {
	spared := false
	eachOutcome(tx, id, gracePrefix, func(name string, _ []byte) bool {
		end, ok := graceEnd(name)
		spared = ok && now.Before(end)
		return !spared
	})
	return spared
}

// DefaultHolderIdle is Config.HolderIdle's default.
const DefaultHolderIdle = 2 * time.Minute

// holderKey is the xattr recording an open handle: built on every
// create and open, so without fmt (which cost 3.5 % of a create loop's CPU).
func holderKey(session, handle uint64) string {
	b := make([]byte, 0, len(orphanPrefix)+33)
	b = append(b, orphanPrefix...)
	b = hex.AppendEncode(b, binary.BigEndian.AppendUint64(nil, session)) // %016x
	b = append(b, '/')
	return string(hex.AppendEncode(b, binary.BigEndian.AppendUint64(nil, handle)))
}

func parseHolder(name string) (session, handle uint64, ok bool) {
	_, err := fmt.Sscanf(strings.TrimPrefix(name, orphanPrefix), "%016x/%016x", &session, &handle)
	return session, handle, err == nil && strings.HasPrefix(name, orphanPrefix)
}

// canonNode names the node a session is bound to ("" is this process)
// the same way at every server.
func (s *Server) canonNode(bound string) string {
	if bound == "" {
		return s.cfg.ID
	}
	return bound
}

// orphan records, in tx, the handles open on id, which just lost its
// last link, as its holders.
func (s *Server) orphan(tx *store.Tx, id oid.ID, named []handleKey, anon int) error {
	for _, k := range named {
		node, _ := s.owners.nodeOf(k.session)
		if err := tx.SetXattr(id, holderKey(k.session, k.id), []byte(s.canonNode(node))); err != nil {
			return err
		}
	}
	if anon > 0 {
		if err := tx.SetXattr(id, holderKey(0, s.boot), []byte(s.cfg.ID)); err != nil {
			return err
		}
	}
	if r := s.owned.repl(id.Slice()); r != nil {
		r.addOrphan(id)
	}
	return nil
}

// holdSpared writes the handle h, just opened on id in its rename grace,
// as one of id's holders. Counted here only, it would hold id at this
// server alone: a primary after a failover, where the grace may be over
// by the time the handle registers, would delete the file under it. An
// open without a handle (in process) dies with this server anyway.
func (s *Server) holdSpared(ctx context.Context, id oid.ID, h *wire.HandleRef) error {
	k, ok := keyOf(h)
	if !ok {
		return nil
	}
	return s.update(ctx, 0, func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if m.Nlink > 0 {
			return nil
		}
		return s.orphan(tx, id, []handleKey{k}, 0)
	})
}

// Release implements wire.StorageServer. It ends the handle's count
// here and, when the object is an orphan, its holder, which may have
// been recorded at a previous primary.
func (s *Server) Release(ctx context.Context, req *wire.ReleaseRequest) (*wire.ReleaseResponse, error) {
	id := oid.ID(req.Id)
	pending, anon := s.files.release(id, req.Handle)
	var key, node string
	if k, ok := keyOf(req.Handle); ok {
		key = holderKey(k.session, k.id)
		name, _ := pki.PeerName(ctx)
		node = s.canonNode(s.sessionNode(name))
	} else if anon == 0 {
		key, node = holderKey(0, s.boot), s.cfg.ID
	}
	if key == "" {
		return &wire.ReleaseResponse{}, nil
	}
	// A release racing with the unlink that records it (pending) ends
	// its holder in a transaction after that one; otherwise only an
	// orphan has holders.
	if !pending && !s.mayBeOrphan(id) {
		return &wire.ReleaseResponse{}, nil
	}
	if err := s.primary(id); err != nil {
		return nil, fmt.Errorf("release %v: %w", id, err)
	}
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	err := s.update(ctx, 0, func(tx *store.Tx) error {
		return s.endHolders(tx, id, func(name string, v []byte) bool {
			return name == key && string(v) == node
		}, &dying)
	})
	if err != nil {
		// The client does not retry a release: the sweep ends the
		// holder (while this server stays primary).
		s.files.releasedLate(id, key, node)
		if r := s.owned.repl(id.Slice()); r != nil {
			r.addOrphan(id)
		}
		return nil, fmt.Errorf("release %v: %w", id, err)
	}
	return &wire.ReleaseResponse{}, nil
}

// mayBeOrphan reports whether id may be an orphan: a primary that has
// swept the slice once knows its orphans (a release of a linked file
// then reads nothing); otherwise a local read tells.
func (s *Server) mayBeOrphan(id oid.ID) bool {
	if r := s.owned.repl(id.Slice()); r != nil {
		if is, known := r.knowsOrphan(id); known {
			return is
		}
	}
	return s.isOrphan(id)
}

// isHolder reports whether the handle h, of the calling node, is one of
// orphan id's holders.
func (s *Server) isHolder(ctx context.Context, tx *store.Tx, id oid.ID, h *wire.HandleRef) bool {
	k, ok := keyOf(h)
	if !ok {
		return false
	}
	v, err := tx.Xattr(id, holderKey(k.session, k.id))
	name, _ := pki.PeerName(ctx)
	return err == nil && string(v) == s.canonNode(s.sessionNode(name))
}

// Opens returns the number of opens of id this server counts (tests
// check that clients register their opens at a new primary).
func (s *Server) Opens(id oid.ID) int {
	s.files.mu.Lock()
	defer s.files.mu.Unlock()
	return s.files.opens[id]
}

// isOrphan reports whether this server's copy of id has no link (a
// directory removed while open is one too).
func (s *Server) isOrphan(id oid.ID) bool {
	orphan := false
	_ = s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		orphan = err == nil && m.Nlink == 0
		return nil
	})
	return orphan
}

// endHolders removes the holders of orphan id that end says are over
// and deletes the orphan when none is left, unless handles opened on it
// while it was spared (in its rename grace) are counted here: those hold
// it from now on. An object with links, or gone, is left alone. An id
// deleted or held anew is marked dying (and appended to dying) until
// the caller's Update has committed, as in unlinkObject.
func (s *Server) endHolders(tx *store.Tx, id oid.ID, end func(name string, v []byte) bool, dying *[]oid.ID) error {
	m, err := tx.Meta(id)
	if err != nil || m.Nlink > 0 {
		return nil
	}
	var ended []string
	left := 0
	eachOutcome(tx, id, orphanPrefix, func(name string, v []byte) bool {
		if end(name, v) {
			ended = append(ended, name)
		} else {
			left++
		}
		return true
	})
	removeEnded := func() error {
		for _, name := range ended {
			if err := tx.RemoveXattr(id, name); err != nil && !errors.Is(err, fserr.ErrNoAttr) {
				return err
			}
		}
		return nil
	}
	if left > 0 {
		return removeEnded()
	}
	if has, err := tx.HasEntries(id); err != nil || has {
		return err // a removed directory takes no entries: never here
	}
	named, anon := s.files.unlinked(id)
	*dying = append(*dying, id)
	named = slices.DeleteFunc(named, func(k handleKey) bool { return slices.Contains(ended, holderKey(k.session, k.id)) })
	if slices.Contains(ended, holderKey(0, s.boot)) {
		anon = 0
	}
	if len(named) > 0 || anon > 0 {
		if err := removeEnded(); err != nil {
			return err
		}
		return s.orphan(tx, id, named, anon)
	}
	// The slice's index of orphans forgets it at the next sweep (this
	// transaction may still fail).
	s.log.Debug("orphan reclaimed", "id", id)
	return tx.DeleteObject(id)
}

// holderLive reports whether the holder name (value v) of orphan id may
// still release it: its session showed itself here within HolderIdle,
// counted from since (when this server started serving the slice) at the
// earliest.
func (s *Server) holderLive(id oid.ID, name string, v []byte, since, now time.Time) bool {
	if end, ok := graceEnd(name); ok {
		return now.Before(end)
	}
	session, handle, ok := parseHolder(name)
	if !ok || s.files.wasReleased(id, name, string(v)) {
		return false
	}
	if session == 0 {
		return handle == s.boot && s.files.anonOpen(id)
	}
	last := since
	bound, used, ended, known := s.owners.seen(session)
	if known && s.canonNode(bound) == string(v) {
		if ended {
			return false
		}
		if s.leases.hasStream(session) {
			return true
		}
		if used.After(last) {
			last = used
		}
	}
	return now.Sub(last) < s.cfg.HolderIdle
}

// sweepOrphans ends the holders of slice sl's orphans whose sessions
// are gone, and deletes the orphans left without any. The first sweep of
// a primary reads every object of the slice; later ones only the orphans
// it knows of (made here, or found by that first sweep).
func (s *Server) sweepOrphans(ctx context.Context, sl oid.Slice, r *sliceRepl) error {
	ids, known := r.orphanList()
	now, since := time.Now(), r.servingSince()
	var found, deleted, linked []oid.ID
	seen := map[oid.ID]bool{}
	gone := map[oid.ID]bool{} // orphans with a holder to end
	sessionsEnded := 0        // of them, those not only at the end of a rename grace
	visit := func(tx *store.Tx, m *wire.Meta) {
		id := oid.ID(m.Id)
		if m.Nlink != 0 || seen[id] {
			return
		}
		seen[id] = true
		found = append(found, id)
		any, ends := false, false
		eachOutcome(tx, id, orphanPrefix, func(name string, v []byte) bool {
			any = true
			if !s.holderLive(id, name, v, since, now) {
				gone[id] = true
				_, grace := graceEnd(name)
				ends = ends || !grace
			}
			return true
		})
		if !any {
			gone[id], ends = true, true // no holder at all (written before holders were)
		}
		if ends {
			sessionsEnded++
		}
	}
	err := s.store.View(func(tx *store.Tx) error {
		if !known {
			if err := tx.SliceMetas(sl, func(m *wire.Meta) bool {
				visit(tx, m)
				return true
			}); err != nil {
				return err
			}
		}
		for _, id := range ids {
			switch m, err := tx.Meta(id); {
			case err != nil:
				deleted = append(deleted, id)
			case m.Nlink != 0:
				linked = append(linked, id)
			default:
				visit(tx, m)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.sweptOrphans(found, deleted, linked)
	if len(gone) == 0 {
		return nil
	}
	uctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	err = s.update(withEventual(uctx), 0, func(tx *store.Tx) error {
		for id := range gone {
			end := func(name string, v []byte) bool { return !s.holderLive(id, name, v, since, now) }
			if err := s.endHolders(tx, id, end, &dying); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for id := range gone {
		s.files.forgetReleased(id)
	}
	if sessionsEnded > 0 {
		s.log.Info("holders of unlinked files ended", "slice", sl, "orphans", sessionsEnded)
	}
	s.log.Debug("orphan holders ended", "slice", sl, "orphans", len(gone), "replaced", len(gone)-sessionsEnded)
	return nil
}

// Orphan reports whether this server's copy of id exists and how many
// holders it records (tests check that orphans and their holders cross a
// failover, and that they go).
func (s *Server) Orphan(id oid.ID) (exists bool, holders int, err error) {
	err = s.store.View(func(tx *store.Tx) error {
		if _, err := tx.Meta(id); err != nil {
			return nil
		}
		exists = true
		eachOutcome(tx, id, orphanPrefix, func(string, []byte) bool {
			holders++
			return true
		})
		return nil
	})
	return exists, holders, err
}

// dropLegacyOrphans removes the local orphan/<id> keys of stores written
// before holders were replicated; their objects, if still orphans
// without holders, go at the primary's first sweep.
func (s *Server) dropLegacyOrphans(ctx context.Context) error {
	var keys []string
	if err := s.store.View(func(tx *store.Tx) (err error) {
		keys, err = tx.SysKeys("orphan/")
		return err
	}); err != nil || len(keys) == 0 {
		return err
	}
	return s.update(ctx, 1, func(tx *store.Tx) error {
		for _, k := range keys {
			if err := tx.DeleteSys(k); err != nil {
				return err
			}
		}
		return nil
	})
}
