package client

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// leaseSlack shortens every lease on this side, so clock-rate differences
// between client and server never let the client outlive it.
const leaseSlack = 0.95

// staleKeep is how long meta-data stays cached after its lease ended: it
// is served only to .EventualConsistency callers that reach no replica.
const staleKeep = 10 * time.Minute

// maxCachedObjects bounds the meta-data cache.
const maxCachedObjects = 1 << 16

// leases is this client's meta-data cache (paper §5.4): objects' meta-data,
// directory entries and listings, each usable without asking the primary
// while the primary's lease on the object lasts. Leases arrive with
// responses; revocations arrive on one back channel per server (the
// Callbacks stream), and are acknowledged once the cache forgot them.
type leases struct {
	f       *FS
	session uint64
	ctx     context.Context
	stop    context.CancelFunc

	mu      sync.Mutex
	objs    map[oid.ID]*cached
	gen     uint64                 // revocations so far
	revoked map[oid.ID]revokedMark // last revocation of each object
	chans   map[string]*backChannel
	refs    map[oid.ID]*refList // block lists of closed files
	closing bool                // close began: no new back channel (it would get no bye)
	pending map[oid.ID]int      // own changes in flight (own.go): not served meanwhile

	onRevoke func(context.Context, []oid.ID)
}

type revokedMark struct {
	gen uint64
	at  time.Time
}

// cached is what the client knows of one object.
type cached struct {
	server  string
	chanGen uint64    // back channel incarnation the lease came through
	until   time.Time // the lease's end (zero: none)
	stale   bool      // revoked, or its back channel broke

	meta    *wire.Meta
	xattrs  *xattrSet              // extended attributes (used only at meta's version)
	entries map[string]*wire.Entry // names looked up
	absent  map[string]bool        // names looked up and missing
	list    []*wire.Entry          // the whole listing, when read
	listed  bool
	sorted  bool // list is in name order (as servers send it): missing names are known
	// listOwned: list is the cache's own copy (own changes edit it in
	// place); otherwise the request that read it may still hold it.
	listOwned bool
	// listEdits holds this client's changes to a sorted listing that are
	// not merged into list yet (name → entry; nil: removed). Inserting
	// each into the slice moved its tail: O(n) per create or unlink, a
	// quadratic rm -rf of a big directory (docs/BENCHMARKS.md). find
	// reads them first; listing merges them, as adoptListed does once
	// they are a quarter of the listing.
	listEdits map[string]*wire.Entry
	at        time.Time // last filled
	used      bool      // served from since filled by a push (Revoke.updates)
}

// maxAbsent bounds the missing names remembered per directory.
const maxAbsent = 1024

// setAbsent remembers that name is missing from the directory.
func (c *cached) setAbsent(name string) {
	if c.absent == nil || len(c.absent) >= maxAbsent {
		c.absent = map[string]bool{}
	}
	c.absent[name] = true
}

// find answers whether name is in the directory from what is cached:
// known is false when the cache cannot tell; e is nil when it is missing.
func (c *cached) find(name string) (e *wire.Entry, known bool) {
	if e := c.entries[name]; e != nil {
		return e, true
	}
	if c.absent[name] {
		return nil, true
	}
	if !c.listed || !c.sorted {
		return nil, false
	}
	if e, ok := c.listEdits[name]; ok {
		return e, true
	}
	i, ok := slices.BinarySearchFunc(c.list, name, func(e *wire.Entry, n string) int { return strings.Compare(e.Name, n) })
	if ok {
		return c.list[i], true
	}
	return nil, true
}

// xattrSet is what a client knows of an object's extended attributes at
// one meta-data version (from the summary leased with it). It is never
// changed once shared: withValue copies.
type xattrSet struct {
	version uint64
	names   []string          // every name, sorted
	values  map[string][]byte // the values known
}

func newXattrSet(s *wire.XattrSummary) *xattrSet {
	if s == nil {
		return nil
	}
	x := &xattrSet{version: s.Version, names: make([]string, 0, len(s.Attrs)), values: map[string][]byte{}}
	for _, a := range s.Attrs {
		x.names = append(x.names, a.Name)
		if !a.Omitted {
			x.values[a.Name] = a.Value
		}
	}
	slices.Sort(x.names)
	return x
}

// has reports whether the object has attribute name.
func (x *xattrSet) has(name string) bool {
	_, ok := slices.BinarySearch(x.names, name)
	return ok
}

// withValue returns x with name's value known.
func (x *xattrSet) withValue(name string, v []byte) *xattrSet {
	y := &xattrSet{version: x.version, names: x.names, values: maps.Clone(x.values)}
	y.values[name] = v
	return y
}

// refList is the block list of a version of a closed file.
type refList struct {
	version uint64
	hashes  map[uint64]blockRef
	loaded  map[uint64]bool
}

// backChannel is the Callbacks stream to one server.
type backChannel struct {
	id    string
	gen   uint64        // current incarnation; 0 while down
	ready chan struct{} // closed when the first attempt to open it ended
	once  sync.Once

	sendMu sync.Mutex // one sender at a time on stream
	stream grpc.BidiStreamingClient[wire.CallbackAck, wire.Revoke]
	ended  chan struct{} // closed when the current stream's serve returns
}

// backChannelWait bounds how long the first request to a server waits
// for the back channel to open (no round trip: the stream's first message
// is only sent), so that it can already ask for a lease.
const backChannelWait = time.Second

// leaseToken remembers, for one request, what must still hold when its
// answer arrives for the lease to count.
type leaseToken struct {
	server  string
	chanGen uint64
	revGen  uint64
	start   time.Time
}

func newLeases(f *FS) *leases {
	var b [8]byte
	rand.Read(b[:])
	sess := binary.LittleEndian.Uint64(b[:]) | 1
	ctx, cancel := context.WithCancel(context.Background())
	return &leases{f: f, session: sess, ctx: ctx, stop: cancel, objs: map[oid.ID]*cached{},
		revoked: map[oid.ID]revokedMark{}, chans: map[string]*backChannel{}, refs: map[oid.ID]*refList{}}
}

// begin prepares a request to server c that may bring a lease: it starts
// the server's back channel if needed and returns the session to send
// (0 while the channel is down: no lease can be kept) and a token. The
// first requests to a server wait (within ctx and backChannelWait) for
// the channel's first attempt to open, so that even a cold client's
// first listing comes with a lease. (The server may still attach the
// stream after it answered: then that answer brings no lease.)
func (l *leases) begin(ctx context.Context, c Conn) (uint64, leaseToken) {
	if l.f.cfg.NoLeases || c.ID == "" {
		return 0, leaseToken{server: c.ID, start: time.Now()}
	}
	l.mu.Lock()
	bc := l.chans[c.ID]
	if bc == nil {
		bc = &backChannel{id: c.ID, ready: make(chan struct{})}
		l.chans[c.ID] = bc
		go l.run(bc, c.StorageClient)
	}
	if bc.gen == 0 {
		l.mu.Unlock()
		t := time.NewTimer(backChannelWait)
		select {
		case <-bc.ready:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	t := leaseToken{server: c.ID, chanGen: bc.gen, revGen: l.gen, start: time.Now()}
	if bc.gen == 0 {
		return 0, t
	}
	return l.session, t
}

// slot returns the cache slot of id, creating it.
func (l *leases) slot(id oid.ID) *cached {
	c := l.objs[id]
	if c == nil {
		if len(l.objs) >= maxCachedObjects {
			l.evict()
		}
		c = &cached{}
		l.objs[id] = c
	}
	return c
}

// evict drops stale and expired objects, or, if none, an arbitrary half.
func (l *leases) evict() {
	now := time.Now()
	for id, c := range l.objs {
		if !l.validLocked(c, now) && now.Sub(c.at) > staleKeep/10 {
			delete(l.objs, id)
		}
	}
	for id := range l.objs {
		if len(l.objs) < maxCachedObjects/2 {
			break
		}
		delete(l.objs, id)
	}
}

// record stores what fill sets on id's slot, under the lease ms granted
// for token t. Without a lease (or if the object was revoked since the
// request began) the data is kept stale, for .EventualConsistency.
func (l *leases) record(t leaseToken, ms uint32, id oid.ID, fill func(c *cached)) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.slot(id)
	valid := ms > 0 && t.chanGen != 0 && t.chanGen == l.chanGen(t.server) &&
		l.revoked[id].gen <= t.revGen
	if valid {
		if c.stale || c.server != t.server || c.chanGen != t.chanGen || c.until.Before(now) {
			// A fresh lease: what the old one covered may be out of date.
			c.entries, c.absent, c.list, c.listEdits, c.listed, c.listOwned, c.xattrs = nil, nil, nil, nil, false, false, nil
		}
		c.server, c.chanGen, c.stale = t.server, t.chanGen, false
		c.until = leaseEnd(t, ms)
	} else if l.validLocked(c, now) {
		// Do not let an unleased answer replace leased state.
		return
	} else {
		c.stale = true
	}
	c.at = now
	fill(c)
}

// leaseEnd is when a lease of ms granted to the request of token t ends
// on this side (counted from the request's start, shortened by leaseSlack).
func leaseEnd(t leaseToken, ms uint32) time.Time {
	return t.start.Add(time.Duration(float64(time.Duration(ms)*time.Millisecond) * leaseSlack))
}

func (l *leases) chanGen(server string) uint64 {
	if bc := l.chans[server]; bc != nil {
		return bc.gen
	}
	return 0
}

func (l *leases) validLocked(c *cached, now time.Time) bool {
	return c != nil && !c.stale && now.Before(c.until) && c.chanGen != 0 && c.chanGen == l.chanGen(c.server)
}

// lookup returns a copy of id's cached state if its lease is valid, or
// (when stale is true) whatever is cached.
func (l *leases) lookup(id oid.ID, stale bool, use func(c *cached) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.objs[id]
	if c == nil {
		return false
	}
	if l.isPendingLocked(id) {
		return false // this client is changing it: ask the primary
	}
	valid := l.validLocked(c, time.Now())
	if !valid && !(stale && time.Since(c.at) < staleKeep) {
		return false
	}
	ok := use(c)
	if ok && valid {
		c.used = true
	}
	return ok
}

// left is how long id's lease still lasts (0: none).
func (l *leases) left(id oid.ID) time.Duration { return l.leftSince(id, math.MaxUint64) }

// leftSince is left, but 0 also when id was revoked after mark (a value
// of revocationMark): what a request that began at mark learnt of id may
// predate that revocation.
func (l *leases) leftSince(id oid.ID, mark uint64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.objs[id]
	now := time.Now()
	if r, ok := l.revoked[id]; ok && r.gen > mark || !l.validLocked(c, now) || l.isPendingLocked(id) {
		return 0
	}
	return c.until.Sub(now)
}

// revocationMark numbers the revocations so far (see leftSince).
func (l *leases) revocationMark() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gen
}

// meta returns id's cached meta-data (see lookup).
func (l *leases) meta(id oid.ID, stale bool) (*wire.Meta, bool) {
	var m *wire.Meta
	ok := l.lookup(id, stale, func(c *cached) bool {
		if c.meta == nil {
			return false
		}
		m = proto.CloneOf(c.meta)
		return true
	})
	return m, ok
}

// xattrs returns id's cached meta-data with what is known of its extended
// attributes at that version (see lookup).
func (l *leases) xattrs(id oid.ID, stale bool) (*wire.Meta, *xattrSet, bool) {
	var m *wire.Meta
	var x *xattrSet
	ok := l.lookup(id, stale, func(c *cached) bool {
		if c.meta == nil || c.xattrs == nil || c.xattrs.version != c.meta.Version {
			return false
		}
		m, x = proto.CloneOf(c.meta), c.xattrs
		return true
	})
	return m, x, ok
}

// forget drops what is cached of ids after this client changed them: the
// primary revoked its leases already, but a change made at a backup
// (.EventualConsistency) revokes nothing there, and this client must not
// answer from what it knew before its own change. Answers to requests
// already in flight do not count either.
func (l *leases) forget(ids ...oid.ID) {
	now := time.Now()
	l.mu.Lock()
	l.markRevokedLocked(ids, now)
	cb := l.onRevoke
	l.mu.Unlock()
	if cb != nil {
		cb(context.Background(), ids)
	}
}

// markRevokedLocked makes ids' cached state stale, and any lease on them
// from a request that left before now void.
func (l *leases) markRevokedLocked(ids []oid.ID, now time.Time) {
	l.gen++
	for _, id := range ids {
		if c := l.objs[id]; c != nil {
			c.stale = true
		}
		l.revoked[id] = revokedMark{gen: l.gen, at: now}
	}
	if len(l.revoked) > 4*maxCachedObjects {
		for id, m := range l.revoked {
			if now.Sub(m.at) > staleKeep {
				delete(l.revoked, id)
			}
		}
	}
}

// revoke handles a revocation from server bc: the objects' cached state
// becomes stale (or, for updates pushed with it, current again: kept),
// the kernel is told, and open registrations of these objects in flight
// finish first (so the update sees them).
func (l *leases) revoke(ids []uint64, bc *backChannel, gen uint64, updates []*wire.LeaseUpdate) (kept []uint64) {
	oids := make([]oid.ID, len(ids))
	now := time.Now()
	for i, v := range ids {
		oids[i] = oid.ID(v)
	}
	l.mu.Lock()
	l.markRevokedLocked(oids, now)
	kept = l.updateLocked(bc, gen, updates)
	cb := l.onRevoke
	l.mu.Unlock()
	l.f.waitRegistrations(oids)
	if cb != nil {
		cb(context.Background(), oids)
	}
	return kept
}

// updateLocked adopts the state a change left (Revoke.updates), which the
// server pushed with its revocation through back channel bc (incarnation
// gen): the lease on it goes on, for what the push brought only (a
// directory's meta-data; its names and listing are dropped, its xattrs
// unknown at the new version). A cache entry leased through another
// server or incarnation, or already newer, stays as the revocation left
// it (stale).
func (l *leases) updateLocked(bc *backChannel, gen uint64, updates []*wire.LeaseUpdate) (kept []uint64) {
	for _, u := range updates {
		c := l.objs[oid.ID(u.Id)]
		// Only what was used since: a directory another site keeps
		// changing while this one does not look costs the writer a
		// revocation per change for as long as the lease is kept.
		if c == nil || !c.used || c.server != bc.id || c.chanGen != gen || u.Meta == nil ||
			c.meta != nil && c.meta.Version > u.Meta.Version {
			continue
		}
		c.meta, c.xattrs, c.stale, c.used = u.Meta, nil, false, false
		c.entries, c.absent, c.list, c.listEdits, c.listed, c.sorted = nil, nil, nil, nil, false, false
		kept = append(kept, u.Id)
	}
	return kept
}

// run keeps the back channel to one server open; while it is down, what
// that server leased is stale.
func (l *leases) run(bc *backChannel, sc wire.StorageClient) {
	backoff := 50 * time.Millisecond
	for l.ctx.Err() == nil {
		if l.serve(bc, sc) {
			backoff = 50 * time.Millisecond
		}
		select {
		case <-time.After(backoff):
		case <-l.ctx.Done():
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// holdEvery is how often the client core makes sure it has a back
// channel to the primary of every file it holds open. The channel is
// how a primary knows this session still holds a file unlinked while
// open (server.Config.HolderIdle): a new primary after a failover too,
// which it may not have asked anything yet.
const holdEvery = 2 * time.Second

// keepHolding runs until the client core closes, opening back channels
// to the primaries of its open files where there are none, and
// registering its opens at a slice's new primary (FS.reregister). It
// sends nothing where the channel is open and the primary the same.
func (l *leases) keepHolding() {
	t := time.NewTicker(holdEvery)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		f := l.f
		held := map[oid.Slice]bool{}
		f.mu.Lock()
		for id := range f.files {
			held[id.Slice()] = true
		}
		f.mu.Unlock()
		primaries := map[oid.Slice]string{}
		for sl := range held {
			ctx, cancel := context.WithTimeout(l.ctx, holdEvery)
			c, err := f.router.Primary(ctx, sl)
			cancel()
			if err == nil {
				l.ensure(c)
				primaries[sl] = c.ID
			}
		}
		for _, h := range f.heldHandles() {
			if p := primaries[h.obj.Slice()]; p != "" {
				f.reregister(h, p)
			}
		}
	}
}

// ensure starts the back channel to server c if there is none.
func (l *leases) ensure(c Conn) {
	if c.ID == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.chans[c.ID] == nil && !l.closing {
		bc := &backChannel{id: c.ID, ready: make(chan struct{})}
		l.chans[c.ID] = bc
		go l.run(bc, c.StorageClient)
	}
}

// chanGens numbers back channel incarnations (never 0).
var chanGens atomic.Uint64

// serve runs one incarnation of the back channel and reports whether it
// came up.
func (l *leases) serve(bc *backChannel, sc wire.StorageClient) bool {
	ctx, cancel := context.WithCancel(l.ctx)
	defer cancel()
	opened := func() { bc.once.Do(func() { close(bc.ready) }) }
	defer opened() // also when it failed: requests go on without a lease
	stream, err := sc.Callbacks(ctx)
	if err == nil {
		err = stream.Send(&wire.CallbackAck{Session: l.session})
	}
	if err != nil {
		return false
	}
	gen := chanGens.Add(1)
	ended := make(chan struct{})
	l.mu.Lock()
	bc.gen, bc.stream, bc.ended = gen, stream, ended
	l.mu.Unlock()
	opened()
	defer func() {
		l.mu.Lock()
		bc.gen, bc.stream = 0, nil // every lease it brought is stale now
		l.mu.Unlock()
		close(ended)
	}()
	for {
		r, err := stream.Recv()
		if err != nil {
			if l.ctx.Err() == nil {
				l.f.log.Debug("lease back channel lost", slog.String("server", bc.id), slog.Any("err", err))
			}
			return true
		}
		kept := l.revoke(r.Ids, bc, gen, r.Updates)
		bc.sendMu.Lock()
		err = stream.Send(&wire.CallbackAck{Session: l.session, Seq: r.Seq, Kept: kept})
		bc.sendMu.Unlock()
		if err != nil {
			return true
		}
	}
}

// byeWait bounds how long closing waits for servers to take its bye.
const byeWait = time.Second

// close ends the back channels. Each server is told first (bye), after
// every lease it granted stopped counting here, so that it forgets them
// instead of making the next change to what this client cached wait for
// them to run out.
func (l *leases) close() {
	type bye struct {
		bc     *backChannel
		stream grpc.BidiStreamingClient[wire.CallbackAck, wire.Revoke]
	}
	l.mu.Lock()
	l.closing = true
	var byes []bye
	var ends []chan struct{}
	for _, bc := range l.chans {
		if bc.stream != nil {
			bc.gen = 0 // nothing it leased counts any more
			byes = append(byes, bye{bc, bc.stream})
			ends = append(ends, bc.ended)
		}
	}
	l.mu.Unlock()
	for _, b := range byes {
		go func() {
			b.bc.sendMu.Lock()
			defer b.bc.sendMu.Unlock()
			if err := b.stream.Send(&wire.CallbackAck{Session: l.session, Bye: true}); err == nil {
				_ = b.stream.CloseSend()
			}
		}()
	}
	// The server ends the stream once it took the bye.
	t := time.NewTimer(byeWait)
	defer t.Stop()
	for _, ch := range ends {
		select {
		case <-ch:
		case <-t.C:
		}
	}
	l.stop()
}

// keepRefs remembers the block list of a closed, unmodified file version.
func (l *leases) keepRefs(id oid.ID, version uint64, hashes map[uint64]blockRef, loaded map[uint64]bool) {
	if len(loaded) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.refs) >= maxCachedObjects/4 {
		for k := range l.refs {
			delete(l.refs, k)
			if len(l.refs) < maxCachedObjects/8 {
				break
			}
		}
	}
	l.refs[id] = &refList{version: version, hashes: hashes, loaded: loaded}
}

// peekRefs returns a copy of the remembered first block references of
// id at version, leaving them for the open that takes them.
func (l *leases) peekRefs(id oid.ID, version uint64) (map[uint64]blockRef, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.refs[id]
	if r == nil || r.version != version || !r.loaded[0] {
		return nil, false
	}
	return maps.Clone(r.hashes), true
}

// takeRefs returns the remembered block list of id at version.
func (l *leases) takeRefs(id oid.ID, version uint64) (map[uint64]blockRef, map[uint64]bool, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.refs[id]
	if r == nil || r.version != version {
		return nil, nil, false
	}
	delete(l.refs, id)
	return r.hashes, r.loaded, true
}
