package client

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Own changes. A change this client makes to a directory it holds a lease
// on used to cost that lease: the primary called this client back like any
// other holder, and the next lookup in the directory asked the primary
// again (a one-host tar -x paid a callback, a Sync and a Lookup per file;
// docs/BENCHMARKS.md, issue 15). Now the client adopts its own change
// instead. While the change is in flight nothing of the objects it
// changes is served from the cache (pending), so no system call that
// begins after the primary applied it can see the state it replaced; the
// request names them (Caller.adopt) and the primary skips this client's
// callbacks for them; the answer brings the directory's new meta-data,
// which the client applies to what it holds, with the name added or
// removed, and its lease goes on. Anything it cannot apply exactly (a
// version gap: another change came between) is dropped as a revocation
// would have dropped it.

// ownChange is one change of this client in flight.
type ownChange struct {
	l   *leases
	ids []oid.ID // pending until end
	// answered is the server the last attempt went to, adopted what
	// this client leased from it, with tok taken before it was sent.
	answered string
	adopted  []oid.ID
	tok      leaseToken
	// renewMs is the lease the answer renewed on ids[0], the directory
	// changed (ms), set before end.
	renewMs uint32
	// ctx is the last attempt's: end hands it to onRevoke with what it
	// drops (the FUSE adapter knows the inodes the system call went
	// through from it).
	ctx context.Context
}

// beginOwn marks ids pending for a change this client is about to send.
// (An unlink waits for the registrations of opens served from the cache
// first, as a callback would have: the primary must see them.)
func (l *leases) beginOwn(ids ...oid.ID) *ownChange {
	l.mu.Lock()
	if l.pending == nil {
		l.pending = map[oid.ID]int{}
	}
	for _, id := range ids {
		l.pending[id]++
	}
	l.mu.Unlock()
	return &ownChange{l: l, ids: ids}
}

// prep readies req for an attempt at server c: it names this client's
// session (so that the answer may bring leases) and the objects whose
// leases from c it adopts.
func (o *ownChange) prep(ctx context.Context, c Conn, caller *wire.Caller) {
	l := o.l
	sess, tok := l.begin(ctx, c)
	caller.Session, caller.Adopt = sess, nil
	o.answered, o.adopted, o.tok, o.ctx = c.ID, nil, tok, ctx
	if sess == 0 {
		return
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range o.ids {
		if cc := l.objs[id]; l.validLocked(cc, now) && cc.server == c.ID && len(caller.Adopt) < wire.MaxAdopt {
			caller.Adopt = append(caller.Adopt, uint64(id))
			o.adopted = append(o.adopted, id)
		}
	}
}

// end closes the change: for each adopted object, apply (under the
// leases' lock, with its cache entry) brings the cache to the state the
// change left and reports whether it could; what it could not, what was
// not adopted, and everything after a failed change (ok false: it may
// or may not have been applied) is dropped. Answers to requests that
// began before the end do not count for ids either way.
func (o *ownChange) end(ok bool, apply func(id oid.ID, c *cached) bool) {
	l := o.l
	now := time.Now()
	l.mu.Lock()
	for _, id := range o.ids {
		if l.pending[id]--; l.pending[id] <= 0 {
			delete(l.pending, id)
		}
	}
	var dropped []oid.ID
	l.gen++
	for _, id := range o.ids {
		c := l.objs[id]
		kept := ok && slices.Contains(o.adopted, id) && l.validLocked(c, now) && c.server == o.answered &&
			apply != nil && apply(id, c)
		if !kept {
			dropped = append(dropped, id)
			continue
		}
		l.revoked[id] = revokedMark{gen: l.gen, at: now}
		if until := leaseEnd(o.tok, o.renewMs); id == o.ids[0] && o.renewMs > 0 && until.After(c.until) {
			c.until = until
		}
	}
	if len(dropped) == 0 {
		l.mu.Unlock()
		return
	}
	l.markRevokedLocked(dropped, now)
	cb := l.onRevoke
	l.mu.Unlock()
	if cb != nil {
		ctx := o.ctx
		if !ok || ctx == nil {
			ctx = context.Background() // the system call failed: the kernel changed nothing
		}
		cb(ctx, dropped) // the kernel may hold names or attributes of them
	}
}

// isPendingLocked reports whether a change of this client to id is in flight
// (l.mu held).
func (l *leases) isPendingLocked(id oid.ID) bool { return l.pending[id] > 0 }

// adoptEntryChange applies to c, a directory's cache entry, the change
// that left it at meta-data d: name now names e (nil: removed). It
// reports false when c cannot be brought there exactly: d is not the
// version c holds or the next one.
func adoptEntryChange(c *cached, d *wire.Meta, name string, e *wire.Entry) bool {
	if d == nil || c.meta == nil {
		return false
	}
	switch d.Version {
	case c.meta.Version: // an answer since brought it (its names may predate it)
	case c.meta.Version + 1:
		if x := c.xattrs; x != nil && x.version == c.meta.Version {
			// Names change no extended attribute.
			c.xattrs = &xattrSet{version: d.Version, names: x.names, values: x.values}
		}
		c.meta = d
	default:
		return false
	}
	if e != nil {
		if c.entries == nil {
			c.entries = map[string]*wire.Entry{}
		}
		c.entries[name] = e
		delete(c.absent, name)
	} else {
		delete(c.entries, name)
		c.setAbsent(name)
	}
	if c.listed {
		c.adoptListed(name, e)
	}
	return true
}

// adoptListed adds or removes name in the cached listing. A sorted one
// notes the change (listEdits) and merges the changes once they are a
// quarter of it (a create or unlink costs O(log n) amortized, not a move
// of the listing's tail). An unsorted one, rare, is changed in place,
// copied once first: the request that read it may still hold it.
func (c *cached) adoptListed(name string, e *wire.Entry) {
	if c.sorted {
		if c.listEdits == nil {
			c.listEdits = map[string]*wire.Entry{}
		}
		c.listEdits[name] = e
		if len(c.listEdits) > max(minListEdits, len(c.list)/4) {
			c.mergeListEdits()
		}
		return
	}
	if !c.listOwned {
		c.list, c.listOwned = slices.Clone(c.list), true
	}
	i := slices.IndexFunc(c.list, func(x *wire.Entry) bool { return x.Name == name })
	switch {
	case e != nil && i >= 0:
		c.list[i] = e
	case e != nil:
		c.list = append(c.list, e)
	case i >= 0:
		c.list = slices.Delete(c.list, i, i+1)
	}
}

// minListEdits is how many changes a sorted listing collects before they
// are merged into it, however short it is.
const minListEdits = 64

// listing returns the cached listing with this client's changes merged.
func (c *cached) listing() []*wire.Entry {
	c.mergeListEdits()
	return c.list
}

// mergeListEdits merges listEdits into a new copy of the sorted listing.
func (c *cached) mergeListEdits() {
	if len(c.listEdits) == 0 {
		return
	}
	names := slices.Sorted(maps.Keys(c.listEdits))
	out := make([]*wire.Entry, 0, len(c.list)+len(names))
	i := 0
	for _, name := range names {
		for i < len(c.list) && c.list[i].Name < name {
			out = append(out, c.list[i])
			i++
		}
		if i < len(c.list) && c.list[i].Name == name {
			i++ // replaced or removed
		}
		if e := c.listEdits[name]; e != nil {
			out = append(out, e)
		}
	}
	c.list, c.listEdits, c.listOwned = append(out, c.list[i:]...), nil, true
}

// adoptMeta applies to c the change that left its object at meta-data
// m (a setattr or commit of this client), unless c cannot be brought
// there exactly (see adoptEntryChange).
func adoptMeta(c *cached, m *wire.Meta) bool {
	if m == nil || c.meta == nil {
		return false
	}
	switch m.Version {
	case c.meta.Version:
	case c.meta.Version + 1:
		// Extended attributes: a mode change changes the ACL's.
		c.meta, c.xattrs = m, nil
	default:
		return false
	}
	return true
}

// recordNew keeps what this client's create brought of the new object
// under the lease granted with it: a new directory is known to be empty,
// so lookups in it need no server until someone else changes it.
func (l *leases) recordNew(o *ownChange, ms uint32, m *wire.Meta) {
	if m == nil || ms == 0 {
		return
	}
	l.record(o.tok, ms, oid.ID(m.Id), func(c *cached) {
		c.meta, c.xattrs = m, nil
		if m.Type == wire.Type_TYPE_DIR {
			c.entries, c.absent = nil, nil
			c.list, c.listEdits, c.listed, c.sorted, c.listOwned = nil, nil, true, true, true
		}
	})
}

// updateOwn is update for a change this client adopts (ownChange): ids
// are the objects it changes that it may hold leases on. Under
// .EventualConsistency (a backup may apply it, and revokes nothing) or
// without leases it is update, after which ids are dropped.
func updateOwn[Req request, Resp any](ctx context.Context, f *FS, cues cue.Set, id oid.ID, rpc rpcFunc[Req, Resp], req Req, ids []oid.ID) (Resp, *ownChange, error) {
	o := f.leases.beginOwn(ids...)
	if cues.EventualConsistency || f.cfg.NoLeases {
		resp, err := update(ctx, f, cues, id, rpc, req)
		return resp, o, err
	}
	caller := req.GetCaller()
	defer f.ops.stamp(caller)()
	resp, err := callVia(ctx, f, id, rpc, req, callOpts{prep: func(c Conn) { o.prep(ctx, c, caller) }})
	return resp, o, err
}
