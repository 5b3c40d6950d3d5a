package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// newer reports whether replica state a of an object beats b: the higher
// version, then (for equal versions written apart) the higher meta-data
// checksum, so every replica picks the same winner.
func newer(a, b *wire.Meta) bool {
	if a.GetVersion() != b.GetVersion() {
		return a.GetVersion() > b.GetVersion()
	}
	return store.MetaSum(a) > store.MetaSum(b)
}

// mergeFile returns the reconciled state of a file, symlink or other
// non-directory from the primary's and a backup's: the newer one, with a
// version above both (so caches notice) and the primary's link count
// (links travel as entry changes).
func mergeFile(mine, theirs *wire.ObjectState) (out *wire.ObjectState, theirsWon bool) {
	w := mine
	if newer(theirs.GetMeta(), mine.GetMeta()) {
		w, theirsWon = theirs, true
	}
	out = proto.Clone(w).(*wire.ObjectState)
	out.Meta.Version = max(mine.GetMeta().GetVersion(), theirs.GetMeta().GetVersion()) + 1
	out.Meta.Nlink = mine.GetMeta().GetNlink()
	return out, theirsWon
}

// mergeDirMeta returns a directory's reconciled meta-data: attributes
// (the ACLs with the mode they complete) from the newer replica, the
// later mtime, the primary's link count (entries merge separately) and a
// version above both.
func mergeDirMeta(mine, theirs *wire.Meta) *wire.Meta {
	out := proto.Clone(mine).(*wire.Meta)
	if newer(theirs, mine) {
		out.Mode, out.Uid, out.Gid = theirs.Mode, theirs.Uid, theirs.Gid
		out.Acl, out.DefaultAcl = theirs.Acl, theirs.DefaultAcl
		out.AtimeNs, out.CtimeNs = theirs.AtimeNs, max(mine.CtimeNs, theirs.CtimeNs)
	}
	out.MtimeNs = max(mine.MtimeNs, theirs.MtimeNs)
	out.Version = max(mine.Version, theirs.Version) + 1
	return out
}

// conflictName is the name the loser of a name clash in a union-merged
// directory gets: deterministic, so every replica agrees.
func conflictName(name string, id oid.ID) string { return fmt.Sprintf("%s~%016x", name, uint64(id)) }

// entryOutcome is what a merge does with a name that a backup pushed
// with entry in while the primary has cur there.
type entryOutcome struct {
	put      *wire.Entry // the entry the name gets (nil: unchanged)
	moved    *wire.Entry // the loser, kept under another name (union merge)
	movedTo  string
	unlinked *wire.Entry // the loser, dropped (last writer wins)
	twin     bool        // moved is a copy of put's create
}

// resolveEntry applies the name-clash rules. In a directory created with
// .EventualConsistency (union merge) the smallest id keeps the name and
// the other object moves to conflictName; elsewhere the entry with the
// higher per-entry version wins, the primary's on a tie, and the loser's
// name is dropped.
func resolveEntry(union bool, cur, in *wire.Entry) entryOutcome {
	switch {
	case cur == nil:
		return entryOutcome{put: in}
	case cur.Id == in.Id:
		return entryOutcome{}
	case cur.Op != 0 && cur.Op == in.Op:
		// One create made at two replicas (an eventual fallback after
		// the primary's answer was late): the later attempt is the one
		// its client heard of and keeps the name. The other is kept
		// under another name, unless it is known to be empty.
		if in.Attempt > cur.Attempt || in.Attempt == cur.Attempt && in.Id < cur.Id {
			return entryOutcome{put: in, moved: cur, movedTo: conflictName(cur.Name, oid.ID(cur.Id)), twin: true}
		}
		return entryOutcome{moved: in, movedTo: conflictName(in.Name, oid.ID(in.Id)), twin: true}
	case union && in.Id < cur.Id:
		return entryOutcome{put: in, moved: cur, movedTo: conflictName(cur.Name, oid.ID(cur.Id))}
	case union:
		return entryOutcome{moved: in, movedTo: conflictName(in.Name, oid.ID(in.Id))}
	case in.Version > cur.Version:
		return entryOutcome{put: in, unlinked: cur}
	default:
		return entryOutcome{unlinked: in}
	}
}

// IDs and takeovers. A primary that takes a slice over starts its IDs
// in a fresh block of 1<<tailBlockBits, so that those its predecessor
// handed out without its backups knowing (eventual creates) stay
// unique. An ID below the counter in the current block was issued by
// this line of primaries; one from an earlier block may be such a lost
// tail.
const tailBlockBits = 22

// tailFloor is the first ID counter of the block after counter's.
func tailFloor(counter uint64) uint64 { return (counter>>tailBlockBits + 1) << tailBlockBits }

// issuedHere reports whether id was handed out in its slice's current
// block, whose next counter is next: if such an object is missing, it
// was deleted.
func issuedHere(id oid.ID, next uint64) bool {
	return id.Counter() < next && id.Counter() >= next>>tailBlockBits<<tailBlockBits
}

// Merging (primary side).

// mergePush merges a replica's changes into this primary's copy. The
// update does not wait for backups (the pusher is one, and busy until
// answered); the stream carries the result to them.
func (s *Server) mergePush(ctx context.Context, req *wire.ReconcileRequest) error {
	sl := oid.Slice(req.Slice)
	now := time.Now().UnixNano()
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	missing := map[[32]byte]bool{}
	for _, h := range s.retainBlocks(req.Objects) {
		missing[h] = true
	}
	return s.update(withEventual(ctx), 0, func(tx *store.Tx) error {
		for _, st := range req.Objects {
			if err := s.mergeObject(tx, sl, st, missing); err != nil {
				return err
			}
		}
		for _, ch := range req.Entries {
			if err := s.mergeEntry(tx, sl, ch, now, &dying); err != nil {
				return err
			}
		}
		return nil
	})
}

// mergeObject merges one pushed object; missing lists the blocks this
// server lacks (retainBlocks, before the update: fn may not call View).
func (s *Server) mergeObject(tx *store.Tx, sl oid.Slice, st *wire.ObjectState, missing map[[32]byte]bool) error {
	m := st.GetMeta()
	id := oid.ID(m.GetId())
	if id.Slice() != sl {
		return nil
	}
	for _, b := range st.Blocks {
		if len(b.Hash) != 32 || missing[[32]byte(b.Hash)] {
			s.log.Warn("reconcile: a block of the pushed object is missing; keeping ours", "id", id)
			return nil
		}
	}
	cur, err := tx.Meta(id)
	if errors.Is(err, fserr.ErrNotExist) {
		if issuedHere(id, tx.Counter(sl)) {
			return nil // deleted here: ids are never reused
		}
		// Created by a primary whose batch was lost in a failover (or,
		// from an earlier block, deleted here: then it stays unlinked).
		if err := tx.InstallObject(st); err != nil {
			return err
		}
		return tx.SetCounterFloor(sl, id.Counter()+1)
	} else if err != nil {
		return err
	}
	if cur.Type != m.Type {
		return nil
	}
	if isDir(cur) {
		return tx.PutMeta(mergeDirMeta(cur, m))
	}
	mine, err := tx.ObjectState(id)
	if err != nil {
		return err
	}
	out, theirs := mergeFile(mine, st)
	if !theirs {
		return tx.PutMeta(out.Meta)
	}
	return tx.InstallObject(out)
}

func (s *Server) mergeEntry(tx *store.Tx, sl oid.Slice, ch *wire.EntryChange, now int64, dying *[]oid.ID) error {
	dir := oid.ID(ch.Dir)
	if dir.Slice() != sl || ch.Name == "" {
		return nil
	}
	d, err := tx.Meta(dir)
	if errors.Is(err, fserr.ErrNotExist) || err == nil && !isDir(d) {
		return nil
	} else if err != nil {
		return err
	}
	changed := false
	// drop removes name from dir, with the link it held.
	drop := func(name string, e *wire.Entry) error {
		child := oid.ID(e.Id)
		if s.primary(child) == nil {
			m, err := tx.Meta(child)
			if err == nil {
				if isDir(m) {
					if has, err := tx.HasEntries(child); err != nil || has {
						return err // not empty here: keep it
					}
				}
				if err := s.unlinkObject(tx, m, now, dying); err != nil {
					return err
				}
			}
		}
		if e.Type == wire.Type_TYPE_DIR && d.Nlink > 2 {
			d.Nlink--
		}
		changed = true
		return tx.DeleteEntry(dir, name)
	}
	put := func(e *wire.Entry) error {
		if e.Type == wire.Type_TYPE_DIR {
			d.Nlink++
		}
		changed = true
		return tx.PutEntry(dir, e)
	}
	for _, r := range ch.Removed {
		e, err := tx.Entry(dir, ch.Name)
		if err == nil && e.Id == r {
			if err := drop(ch.Name, e); err != nil {
				return err
			}
		} else if !hasTombstone(tx, dir, ch.Name, oid.ID(r)) {
			// Keep a re-sent push from bringing it back.
			if err := tx.SetXattr(dir, tombKey(ch.Name, oid.ID(r)), tombValue(s.nextSeq(sl), ch.Name)); err != nil {
				return err
			}
		}
	}
	in := ch.Entry
	if in != nil && in.Name == ch.Name && !hasTombstone(tx, dir, in.Name, oid.ID(in.Id)) {
		child := oid.ID(in.Id)
		if s.primary(child) == nil {
			if _, err := tx.Meta(child); errors.Is(err, fserr.ErrNotExist) && issuedHere(child, tx.Counter(child.Slice())) {
				in = nil // the object was deleted here
			}
		}
		if in != nil {
			cur, err := tx.Entry(dir, in.Name)
			if err != nil && !errors.Is(err, fserr.ErrNotExist) {
				return err
			}
			if err != nil {
				cur = nil
			}
			o := resolveEntry(d.GetCues().GetEventual(), cur, in)
			if o.twin && o.moved == cur && s.emptyHere(tx, oid.ID(cur.Id)) {
				o.moved, o.unlinked = nil, cur // nothing to keep
			}
			if o.moved != nil && o.moved == cur {
				if err := tx.DeleteEntry(dir, cur.Name); err != nil {
					return err
				}
			}
			if o.unlinked != nil && o.unlinked == cur {
				if err := drop(cur.Name, cur); err != nil {
					return err
				}
			}
			if o.put != nil {
				if err := put(o.put); err != nil {
					return err
				}
			}
			if o.moved != nil {
				if e, err := tx.Entry(dir, o.movedTo); err != nil || e.Id != o.moved.Id {
					mv := proto.Clone(o.moved).(*wire.Entry)
					mv.Name = o.movedTo
					if o.moved != cur && mv.Type == wire.Type_TYPE_DIR {
						d.Nlink++
					}
					changed = true
					if err := tx.PutEntry(dir, mv); err != nil {
						return err
					}
				}
			}
		}
	}
	if !changed {
		return nil
	}
	touch(d, now, true)
	return tx.PutMeta(d)
}

// emptyHere reports whether object id, which this server is primary
// for, is an empty directory or an empty file with one link.
func (s *Server) emptyHere(tx *store.Tx, id oid.ID) bool {
	if s.primary(id) != nil {
		return false
	}
	m, err := tx.Meta(id)
	if err != nil {
		return false
	}
	if isDir(m) {
		has, err := tx.HasEntries(id)
		return err == nil && !has
	}
	return m.Size == 0 && m.Nlink <= 1
}

// reconciled merges what a backup changed without the primary
// (Peer.Reconcile) and resends it a snapshot.
func (s *Server) reconciled(ctx context.Context, req *wire.ReconcileRequest) (*wire.ReconcileResponse, error) {
	sl := oid.Slice(req.Slice)
	if err := s.primary(oid.Make(sl, 0)); err != nil {
		return nil, err
	}
	if err := s.fetchMissing(ctx, req.Source, req.Objects); err != nil {
		return nil, err
	}
	if err := s.mergePush(ctx, req); err != nil {
		return nil, fmt.Errorf("reconcile slice %d from %s: %w", sl, req.Source, err)
	}
	r := s.owned.repl(sl)
	if r != nil {
		r.resync(req.Source) // its copy still has its own versions
	}
	return &wire.ReconcileResponse{}, nil
}
