package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Eventual consistency (paper §4.5, §5.3).
//
// A request whose caller sets eventual (.EventualConsistency) may be
// served by a backup of the object's slice when the primary cannot be
// reached: reads use the backup's copy, and writes change it in *backup
// mode* — without replication, with versions bumped as the primary
// would, and with a divergence record per changed object or directory
// entry written in the same transaction. A backup with divergence
// records of a slice refuses its primary's stream (REPL_BUSY) so that
// nothing overwrites its changes before maintenance has pushed them to
// the primary (Peer.Reconcile). The primary merges them through update,
// so the result reaches every replica through the stream, and then
// resends the pushing backup a snapshot. Deleted entries leave
// tombstones that stop a merge from bringing a name back; they are
// collected once every replica has them. docs/ARCHITECTURE.md, "Eventual
// consistency and reconciliation", states the rules.

type eventualKey struct{}

// withEventual marks ctx as a request with .EventualConsistency.
func withEventual(ctx context.Context) context.Context {
	return context.WithValue(ctx, eventualKey{}, true)
}

func isEventual(ctx context.Context) bool {
	v, _ := ctx.Value(eventualKey{}).(bool)
	return v
}

// backs reports whether this server keeps a copy of slice sl: it is in
// the slice's replica list.
func (s *Server) backs(sl oid.Slice) bool {
	t := s.table.Load()
	if t == nil {
		return false
	}
	e, ok := t.Slices[sl]
	return ok && slices.Contains(e.Replicas, s.cfg.ID)
}

// admit checks that this server may serve a request about ids: as
// primary of their slices or, for a caller with .EventualConsistency, as
// a server that keeps a copy of them. The context it returns carries the
// eventual flag for update and local.
func (s *Server) admit(ctx context.Context, c *wire.Caller, ids ...oid.ID) (context.Context, error) {
	ev := c.GetEventual()
	for _, id := range ids {
		if err := s.primary(id); err != nil && (!ev || !s.backs(id.Slice())) {
			return ctx, err
		}
	}
	if ev {
		ctx = withEventual(ctx)
	}
	return ctx, nil
}

// local reports whether a request admitted with ctx may use this
// server's copy of id.
func (s *Server) local(ctx context.Context, id oid.ID) bool {
	return s.primary(id) == nil || isEventual(ctx) && s.backs(id.Slice())
}

// --- Divergence records ---

// Divergence records are local system records, never replicated:
//
//	div/<slice>/o/<id>          an object's meta-data, blocks or attributes
//	div/<slice>/e/<dir>/<name>  a directory entry
//
// Each holds a stamp, so that a record changed while its push was on
// the way is kept, and the batch seq of the change when this server made
// it as primary without waiting for backups (0 in backup mode): such a
// record goes once every backup has the batch, and is pushed to the next
// primary if this server loses the slice before.
func divSlicePrefix(sl oid.Slice) string { return fmt.Sprintf("div/%08x/", uint32(sl)) }

func divObjectKey(id oid.ID) string {
	return fmt.Sprintf("%so/%016x", divSlicePrefix(id.Slice()), uint64(id))
}

func divEntryKey(dir oid.ID, name string) string {
	return fmt.Sprintf("%se/%016x/%s", divSlicePrefix(dir.Slice()), uint64(dir), name)
}

var lastStamp atomic.Uint64

// newStamp returns a record value with a stamp no earlier call
// returned, and seq.
func newStamp(seq uint64) []byte {
	for {
		old := lastStamp.Load()
		n := max(uint64(time.Now().UnixNano()), old+1)
		if lastStamp.CompareAndSwap(old, n) {
			return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, n), seq)
		}
	}
}

func recordSeq(v []byte) uint64 {
	if len(v) != 16 {
		return 0
	}
	return binary.BigEndian.Uint64(v[8:])
}

// diverge records, in tx, that muts changed this server's copy of slice
// sl without its backups knowing: in backup mode (seq 0), or as primary
// in batch seq without waiting for them.
func (s *Server) diverge(tx *store.Tx, sl oid.Slice, muts []*wire.Mutation, seq uint64) error {
	stamp := newStamp(seq)
	seen := map[string]bool{}
	for _, m := range muts {
		var key string
		switch m.Kind {
		case wire.MutationKind_MUT_COUNTER_FLOOR:
			if seq > 0 {
				continue
			}
			// Only the primary allocates a slice's IDs.
			return fmt.Errorf("allocate an id in slice %d as a backup: %w", sl, fserr.ErrNotPrimary)
		case wire.MutationKind_MUT_PUT_ENTRY:
			e := new(wire.Entry)
			if err := proto.Unmarshal(m.Data, e); err != nil {
				return fmt.Errorf("diverge: entry: %w: %v", fserr.ErrInvalid, err)
			}
			key = divEntryKey(oid.ID(m.Id), e.Name)
		case wire.MutationKind_MUT_DELETE_ENTRY:
			key = divEntryKey(oid.ID(m.Id), m.Name)
		case wire.MutationKind_MUT_SET_XATTR, wire.MutationKind_MUT_REMOVE_XATTR:
			if isTombstone(m.Name) {
				continue // follows from the entry change
			}
			key = divObjectKey(oid.ID(m.Id))
		default:
			key = divObjectKey(oid.ID(m.Id))
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		if err := tx.PutSys(key, stamp); err != nil {
			return err
		}
	}
	return nil
}

// diverged reports whether this server holds divergence records of sl.
func diverged(tx *store.Tx, sl oid.Slice) bool {
	keys, _ := tx.SysKeys(divSlicePrefix(sl))
	return len(keys) > 0
}

// --- Tombstones ---

// A tombstone is an extended attribute of the directory, hidden from
// clients (a NUL byte starts its name): tombPrefix, the hash of the
// entry's name, and the removed object's id. Its value is the batch seq
// that recorded it (0 at a backup) followed by the name. Being an
// attribute it is replicated, installed and purged with its directory.
const tombPrefix = "\x00tomb/"

func isTombstone(xattr string) bool { return strings.HasPrefix(xattr, tombPrefix) }

// hidden reports whether an attribute name is the server's, not a client's.
func hidden(xattr string) bool { return strings.HasPrefix(xattr, "\x00") }

func nameHash(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

func tombNamePrefix(name string) string { return fmt.Sprintf("%s%016x/", tombPrefix, nameHash(name)) }

func tombKey(name string, id oid.ID) string {
	return fmt.Sprintf("%s%016x", tombNamePrefix(name), uint64(id))
}

func tombValue(seq uint64, name string) []byte {
	return append(binary.BigEndian.AppendUint64(nil, seq), name...)
}

func parseTomb(v []byte) (seq uint64, name string, ok bool) {
	if len(v) < 8 {
		return 0, "", false
	}
	return binary.BigEndian.Uint64(v), string(v[8:]), true
}

// hasTombstone reports whether name → id was removed from dir.
func hasTombstone(tx *store.Tx, dir oid.ID, name string, id oid.ID) bool {
	v, err := tx.Xattr(dir, tombKey(name, id))
	if err != nil {
		return false
	}
	_, n, ok := parseTomb(v)
	return ok && n == name
}

// tombstoned returns the ids removed from name in dir.
func tombstoned(tx *store.Tx, dir oid.ID, name string) ([]oid.ID, error) {
	names, err := tx.Xattrs(dir)
	if err != nil {
		return nil, err
	}
	p := tombNamePrefix(name)
	var out []oid.ID
	for _, x := range names {
		if !strings.HasPrefix(x, p) {
			continue
		}
		v, err := tx.Xattr(dir, x)
		if err != nil {
			continue
		}
		var id uint64
		if _, n, ok := parseTomb(v); ok && n == name {
			if _, err := fmt.Sscanf(x[len(p):], "%016x", &id); err == nil {
				out = append(out, oid.ID(id))
			}
		}
	}
	return out, nil
}

// tombstones leaves a tombstone for every entry the running update
// removed or pointed elsewhere, and drops those of entries it put back.
// seq gives the batch number a slice's changes will get (0: backup mode).
func tombstones(tx *store.Tx, removed []store.Removed, puts []*wire.Mutation, seq func(oid.Slice) uint64) error {
	for _, r := range removed {
		if _, err := tx.Meta(r.Dir); err != nil {
			continue // the directory went too
		}
		if err := tx.SetXattr(r.Dir, tombKey(r.Name, r.ID), tombValue(seq(r.Dir.Slice()), r.Name)); err != nil {
			return err
		}
	}
	for _, m := range puts {
		if m.Kind != wire.MutationKind_MUT_PUT_ENTRY {
			continue
		}
		e := new(wire.Entry)
		if proto.Unmarshal(m.Data, e) != nil {
			continue
		}
		dir := oid.ID(m.Id)
		if hasTombstone(tx, dir, e.Name, oid.ID(e.Id)) {
			if err := tx.RemoveXattr(dir, tombKey(e.Name, oid.ID(e.Id))); err != nil && !errors.Is(err, fserr.ErrNoAttr) {
				return err
			}
		}
	}
	return nil
}

// --- Merge rules (pure) ---

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
// from the newer replica, the later mtime, the primary's link count
// (entries merge separately) and a version above both.
func mergeDirMeta(mine, theirs *wire.Meta) *wire.Meta {
	out := proto.Clone(mine).(*wire.Meta)
	if newer(theirs, mine) {
		out.Mode, out.Uid, out.Gid = theirs.Mode, theirs.Uid, theirs.Gid
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

// --- Pushing (backup side) ---

// push is a reconcile request built from this server's divergence
// records, and the records' stamps.
type push struct {
	req    *wire.ReconcileRequest
	stamps map[string][]byte
}

// pendingPush reads up to installChunk divergence records of slice sl.
func (s *Server) pendingPush(sl oid.Slice) (*push, error) {
	p := &push{req: &wire.ReconcileRequest{Slice: uint32(sl), Source: s.cfg.ID}, stamps: map[string][]byte{}}
	err := s.store.View(func(tx *store.Tx) error {
		pre := divSlicePrefix(sl)
		keys, err := tx.SysKeys(pre)
		if err != nil {
			return err
		}
		for _, k := range keys[:min(len(keys), installChunk)] {
			v, err := tx.Sys(k)
			if err != nil {
				continue
			}
			p.stamps[k] = v
			rest := k[len(pre):]
			switch {
			case strings.HasPrefix(rest, "o/"):
				var id uint64
				if _, err := fmt.Sscanf(rest[2:], "%016x", &id); err != nil {
					continue
				}
				st, err := tx.ObjectState(oid.ID(id))
				if errors.Is(err, fserr.ErrNotExist) {
					continue // removed here: the entry changes carry it
				} else if err != nil {
					return err
				}
				if isDir(st.Meta) {
					st.Entries = nil // entries travel one by one
				}
				dropTombstones(st)
				p.req.Objects = append(p.req.Objects, st)
			case strings.HasPrefix(rest, "e/") && len(rest) > 19:
				var dir uint64
				if _, err := fmt.Sscanf(rest[2:18], "%016x", &dir); err != nil {
					continue
				}
				ch := &wire.EntryChange{Dir: dir, Name: rest[19:]}
				if e, err := tx.Entry(oid.ID(dir), ch.Name); err == nil {
					ch.Entry = e
				}
				gone, err := tombstoned(tx, oid.ID(dir), ch.Name)
				if err != nil {
					return err
				}
				for _, id := range gone {
					if ch.Entry == nil || oid.ID(ch.Entry.Id) != id {
						ch.Removed = append(ch.Removed, uint64(id))
					}
				}
				p.req.Entries = append(p.req.Entries, ch)
			}
		}
		return nil
	})
	return p, err
}

// dropTombstones removes tombstone attributes from an object's state.
func dropTombstones(st *wire.ObjectState) {
	var names []string
	var vals [][]byte
	for i, n := range st.XattrNames {
		if !hidden(n) && i < len(st.XattrValues) {
			names, vals = append(names, n), append(vals, st.XattrValues[i])
		}
	}
	st.XattrNames, st.XattrValues = names, vals
}

// clearPushed deletes the divergence records of p that did not change
// since it was read.
func (s *Server) clearPushed(ctx context.Context, p *push) error {
	return s.store.Update(ctx, func(tx *store.Tx) error {
		for k, v := range p.stamps {
			if cur, err := tx.Sys(k); err == nil && bytes.Equal(cur, v) {
				if err := tx.DeleteSys(k); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// divergedSlices returns the slices this server holds divergence records of.
func (s *Server) divergedSlices() []oid.Slice {
	var out []oid.Slice
	_ = s.store.View(func(tx *store.Tx) error {
		keys, err := tx.SysKeys("div/")
		for _, k := range keys {
			var sl uint32
			if _, err := fmt.Sscanf(k, "div/%08x/", &sl); err == nil {
				if len(out) == 0 || out[len(out)-1] != oid.Slice(sl) {
					out = append(out, oid.Slice(sl))
				}
			}
		}
		return err
	})
	return out
}

// reconcile pushes this server's divergence records of every slice to
// the slice's primary (or merges them itself if it is the primary now),
// and clears those that were merged.
func (s *Server) reconcile(ctx context.Context) {
	t := s.table.Load()
	if t == nil {
		return
	}
	for _, sl := range s.divergedSlices() {
		if ctx.Err() != nil {
			return
		}
		e, ok := t.Slices[sl]
		if !ok || e.Holder == "" || e.Holder == s.cfg.ID {
			// No primary yet (the one that takes over merges its own or
			// is pushed to), or ours: the stream carries our changes, and
			// clearAcked drops the records.
			continue
		}
		p, err := s.pendingPush(sl)
		if err != nil {
			s.log.Warn("read divergence records", "slice", sl, "err", err)
			continue
		}
		if err = s.sendPush(ctx, e.Holder, p.req); err != nil {
			s.log.Debug("reconciliation postponed", "slice", sl, "primary", e.Holder, "err", err)
			continue
		}
		if err := s.clearPushed(ctx, p); err != nil {
			s.log.Warn("clear divergence records", "slice", sl, "err", err)
			continue
		}
		s.log.Info("reconciled eventual changes", "slice", sl, "primary", e.Holder,
			"objects", len(p.req.Objects), "entries", len(p.req.Entries))
	}
}

func (s *Server) sendPush(ctx context.Context, to string, req *wire.ReconcileRequest) error {
	pc, err := s.peer(ctx, to)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.InstallTimeout)
	defer cancel()
	resp, err := pc.Reconcile(cctx, req)
	if err != nil {
		return fserr.FromStatus(err)
	}
	if resp.Status != wire.ReplStatus_REPL_OK {
		return fmt.Errorf("primary answered %v", resp.Status)
	}
	return nil
}

// --- Merging (primary side) ---

// Reconcile implements wire.PeerServer: merge what a replica changed
// without the primary.
func (p *peerServer) Reconcile(ctx context.Context, req *wire.ReconcileRequest) (*wire.ReconcileResponse, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	sl := oid.Slice(req.Slice)
	if err := s.primary(oid.Make(sl, 0)); err != nil {
		return nil, fserr.ToStatus(err)
	}
	if err := s.fetchMissing(ctx, req.Source, req.Objects); err != nil {
		return nil, fserr.ToStatus(err)
	}
	if err := s.mergePush(ctx, req); err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("reconcile slice %d from %s: %w", sl, req.Source, err))
	}
	s.mu.Lock()
	r := s.repls[sl]
	s.mu.Unlock()
	if r != nil {
		r.resync(req.Source) // its copy still has its own versions
	}
	return &wire.ReconcileResponse{}, nil
}

// mergePush merges a replica's changes into this primary's copy. The
// update does not wait for backups (the pusher is one, and busy until
// answered); the stream carries the result to them.
func (s *Server) mergePush(ctx context.Context, req *wire.ReconcileRequest) error {
	sl := oid.Slice(req.Slice)
	now := time.Now().UnixNano()
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	return s.update(withEventual(ctx), 0, func(tx *store.Tx) error {
		for _, st := range req.Objects {
			if err := s.mergeObject(tx, sl, st); err != nil {
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

func (s *Server) mergeObject(tx *store.Tx, sl oid.Slice, st *wire.ObjectState) error {
	m := st.GetMeta()
	id := oid.ID(m.GetId())
	if id.Slice() != sl {
		return nil
	}
	for _, b := range st.Blocks {
		if len(b.Hash) != 32 || !s.store.HasBlock([32]byte(b.Hash)) {
			s.log.Warn("reconcile: a block of the pushed object is missing; keeping ours", "id", id)
			return nil
		}
	}
	cur, err := tx.Meta(id)
	if errors.Is(err, fserr.ErrNotExist) {
		if id.Counter() < tx.Counter(sl) {
			return nil // deleted here: ids are never reused
		}
		// Created by a primary whose batch was lost in a failover.
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
			if _, err := tx.Meta(child); errors.Is(err, fserr.ErrNotExist) {
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

// nextSeq is the number the running update's batch of slice sl gets
// (updates run one at a time in the store's commit loop); 0 when this
// server is not its primary.
func (s *Server) nextSeq(sl oid.Slice) uint64 {
	s.mu.Lock()
	r := s.repls[sl]
	s.mu.Unlock()
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq + 1
}

// --- Anti-entropy and tombstone collection (primary side) ---

// checkReplicas runs for a slice this server is primary for. Every 30
// maintenance periods it compares the digest of every caught-up backup
// with its own and resends a snapshot to one that differs (a change no
// stream batch or divergence record describes, e.g. a backup restored
// from an old disk); every 5 it collects the tombstones every replica
// has.
func (s *Server) checkReplicas(ctx context.Context, sl oid.Slice, replicas []string, r *sliceRepl) {
	if low, ok := r.everyoneHas(replicas); ok {
		if err := s.clearAcked(ctx, sl, low); err != nil {
			s.log.Warn("clear acknowledged divergence records", "slice", sl, "err", err)
		}
	}
	if r.due(&r.checked, 30*s.cfg.MaintainPeriod) {
		s.compareDigests(ctx, sl, r)
	}
	if !r.due(&r.collected, 5*s.cfg.MaintainPeriod) {
		return
	}
	if upTo, ok := r.everyoneHas(replicas); ok && r.hasTombs() {
		n, err := s.collectTombstones(ctx, sl, upTo)
		if err != nil {
			s.log.Warn("collect tombstones", "slice", sl, "err", err)
		} else if n > 0 {
			s.log.Info("tombstones collected", "slice", sl, "count", n, "up_to_seq", upTo)
		}
	}
}

// compareDigests resends a snapshot to every caught-up backup whose copy
// differs from this primary's at the same stream position.
func (s *Server) compareDigests(ctx context.Context, sl oid.Slice, r *sliceRepl) {
	mine, err := s.digest(sl)
	if err != nil {
		return
	}
	for _, id := range r.caughtUpAt(mine.Seq) {
		pc, err := s.peer(ctx, id)
		if err != nil {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, s.cfg.ProbeTimeout)
		d, err := pc.Digest(dctx, &wire.DigestRequest{Slice: uint32(sl)})
		cancel()
		if err != nil || d.Epoch != mine.Epoch || d.Seq != mine.Seq {
			continue // moved on meanwhile: next time
		}
		if !sameDigest(mine, d) {
			s.log.Warn("backup differs from the primary at the same position; resending a snapshot", "slice", sl, "backup", id)
			r.resync(id)
		}
	}
}

func sameDigest(a, b *wire.DigestResponse) bool {
	return slices.Equal(a.Ids, b.Ids) && slices.Equal(a.Versions, b.Versions) && slices.Equal(a.Sums, b.Sums)
}

// collectTombstones removes the tombstones of slice sl recorded in
// batches up to seq, which every replica has applied, and returns how
// many it removed.
func (s *Server) collectTombstones(ctx context.Context, sl oid.Slice, upTo uint64) (int, error) {
	type tomb struct {
		dir     oid.ID
		key     string
		name    string
		restamp bool // recorded at a backup (seq 0): give it ours
	}
	var old []tomb
	left := false
	err := s.store.View(func(tx *store.Tx) error {
		return tx.SliceMetas(sl, func(m *wire.Meta) bool {
			if !isDir(m) {
				return true
			}
			names, _ := tx.Xattrs(oid.ID(m.Id))
			for _, n := range names {
				if !isTombstone(n) {
					continue
				}
				v, err := tx.Xattr(oid.ID(m.Id), n)
				seq, name, ok := parseTomb(v)
				switch {
				case err == nil && ok && seq == 0:
					old = append(old, tomb{oid.ID(m.Id), n, name, true})
					left = true
				case err == nil && ok && seq <= upTo:
					old = append(old, tomb{oid.ID(m.Id), n, name, false})
				default:
					left = true
				}
			}
			return true
		})
	})
	if err != nil || len(old) == 0 {
		if err == nil && !left {
			s.noTombs(sl)
		}
		return 0, err
	}
	err = s.update(withEventual(ctx), 0, func(tx *store.Tx) error {
		for _, t := range old {
			var err error
			if t.restamp {
				err = tx.SetXattr(t.dir, t.key, tombValue(s.nextSeq(sl), t.name))
			} else if err = tx.RemoveXattr(t.dir, t.key); errors.Is(err, fserr.ErrNoAttr) {
				err = nil
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && !left {
		s.noTombs(sl)
	}
	return len(old), err
}

func (s *Server) noTombs(sl oid.Slice) {
	s.mu.Lock()
	r := s.repls[sl]
	s.mu.Unlock()
	if r != nil {
		r.mu.Lock()
		r.tombs = false
		r.mu.Unlock()
	}
}

// Tombstones returns the number of tombstones in this server's copy of
// directory dir (tests check that they are collected).
func (s *Server) Tombstones(dir oid.ID) (int, error) {
	n := 0
	err := s.store.View(func(tx *store.Tx) error {
		names, err := tx.Xattrs(dir)
		for _, x := range names {
			if isTombstone(x) {
				n++
			}
		}
		return err
	})
	return n, err
}

// Diverged reports whether this server holds eventual changes of slice
// sl that its primary has not merged yet.
func (s *Server) Diverged(sl oid.Slice) bool {
	var d bool
	_ = s.store.View(func(tx *store.Tx) error { d = diverged(tx, sl); return nil })
	return d
}

// clearAcked drops the divergence records of slice sl that this server
// wrote as primary in batches up to low, which every backup has.
func (s *Server) clearAcked(ctx context.Context, sl oid.Slice, low uint64) error {
	var done []string
	err := s.store.View(func(tx *store.Tx) error {
		keys, err := tx.SysKeys(divSlicePrefix(sl))
		for _, k := range keys {
			if v, err := tx.Sys(k); err == nil {
				if seq := recordSeq(v); seq > 0 && seq <= low {
					done = append(done, k)
				}
			}
		}
		return err
	})
	if err != nil || len(done) == 0 {
		return err
	}
	return s.store.Update(ctx, func(tx *store.Tx) error {
		for _, k := range done {
			// Unless rewritten meanwhile by a later change.
			if v, err := tx.Sys(k); err == nil && recordSeq(v) > 0 && recordSeq(v) <= low {
				if err := tx.DeleteSys(k); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
