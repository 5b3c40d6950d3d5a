package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
	"google.golang.org/protobuf/proto"
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
		keys = objectsFirst(keys, pre)
		chosen := map[string]bool{}
		for _, k := range keys[:min(len(keys), installChunk)] {
			chosen[k] = true
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
					// The object goes before its name: a primary that
					// has no such object takes the name for deleted.
					if ok := chosen[divObjectKey(oid.ID(e.Id))]; !ok && hasSys(tx, divObjectKey(oid.ID(e.Id))) {
						delete(p.stamps, k) // next time
						continue
					}
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

// objectsFirst orders a slice's divergence record keys (under prefix
// pre) with the objects' before the entries', so that a chunk carries
// an object before the names that lead to it.
func objectsFirst(keys []string, pre string) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if strings.HasPrefix(k[len(pre):], "o/") {
			out = append(out, k)
		}
	}
	for _, k := range keys {
		if !strings.HasPrefix(k[len(pre):], "o/") {
			out = append(out, k)
		}
	}
	return out
}

func hasSys(tx *store.Tx, key string) bool {
	_, err := tx.Sys(key)
	return err == nil
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

// nextSeq is the number the running update's batch of slice sl gets
// (updates run one at a time in the store's commit loop); 0 when this
// server is not its primary.
func (s *Server) nextSeq(sl oid.Slice) uint64 {
	r := s.owned.repl(sl)
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq + 1
}
