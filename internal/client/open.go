package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/attrs"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/wire"
)

type blockRef struct {
	hash [32]byte
	len  uint32
}

// fileState is what a client knows about one open file: the block list of
// the version it read, and the writes it buffers until close or fsync.
// All handles of the file on this client share it, as POSIX requires.
type fileState struct {
	mu   sync.Mutex
	id   oid.ID
	refs int

	version uint64 // server version that hashes describes
	size    int64  // current size, local writes included
	hashes  map[uint64]blockRef
	loaded  map[uint64]bool // which refsPerFetch-chunks of hashes are known

	nextRead   int64  // offset after the last read, to detect sequential reads
	prefetched uint64 // last block index a prefetch was started for
	// noNearGrant: the primary granted no reads from a replica at this
	// site (nearreplica.go); it is not asked again for this open file.
	noNearGrant bool

	dirty      map[uint64][]byte   // written blocks not yet uploaded
	dirtyBytes int64               // bytes held by dirty
	uploading  map[uint64][]byte   // blocks a background upload is sending
	upDone     chan struct{}       // closed when that upload ends; nil if none
	upErr      error               // a background upload's failure, for the next write or flush
	staged     map[uint64]blockRef // uploaded, not yet committed
	// stagedCommit commits staged blocks that waited Config.StagedFor
	// (nil while nothing is staged).
	stagedCommit *time.Timer
	modified     bool
	mtimeNs      int64

	// view is the file's meta-data as this client sees it: the server's,
	// plus buffered writes and the attribute changes in pending, which
	// are committed with the data.
	view    *wire.Meta
	pending []*wire.SetAttrRequest

	// eventual: a handle opened it with .EventualConsistency, so reads
	// may come from backups, and written data stays in memory until a
	// commit succeeds (it may have to go to a backup instead).
	eventual bool

	// writer is the handle of the last write: the commit of buffered
	// writes goes through its open (and as its user), whichever call
	// makes it (close, fsync, or a truncate that must order after them).
	writer *Handle

	// unsynced is the replication a create made by this client still
	// waits for (CreateRequest.defer_sync): close and fsync wait for it
	// (syncCreate) before they return.
	unsynced []*wire.Unsynced
	// lazy: a change of the file since the last commit (a chmod, chown
	// or utimes, or this client's create of it, CreateResponse.lazy) may
	// not be durable yet at its primary: close and fsync make it so
	// (barrier), as a commit does.
	lazy bool
}

func newFileState(id oid.ID, m *wire.Meta) *fileState {
	st := &fileState{id: id, dirty: map[uint64][]byte{}, staged: map[uint64]blockRef{}, uploading: map[uint64][]byte{}}
	st.reset(m)
	return st
}

// reset forgets the block list and adopts the server's version m.
func (st *fileState) reset(m *wire.Meta) {
	st.view = proto.CloneOf(m)
	st.version = m.Version
	st.size = int64(m.Size)
	st.hashes = map[uint64]blockRef{}
	st.loaded = map[uint64]bool{}
	st.nextRead, st.prefetched = 0, 0
}

// updateMeta adopts meta-data the server returned after a change this
// client made (a truncate drops the cached block list).
func (st *fileState) updateMeta(m *wire.Meta, sizeChanged bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.modified {
		return
	}
	if sizeChanged || m.Version != st.version+1 {
		st.reset(m)
		return
	}
	st.version = m.Version
	st.size = int64(m.Size)
	st.view = proto.CloneOf(m)
}

// deferAttr applies a chmod/chown/utimens to a file with buffered writes
// locally, checking permission as the server will, so that it travels in
// the same commit as the data: one durable write instead of several.
// ok is false when the file has nothing buffered.
func (st *fileState) deferAttr(u User, req *wire.SetAttrRequest) (m *wire.Meta, ok bool, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.modified {
		return nil, false, nil
	}
	req = proto.CloneOf(req)
	req.Caller = u.caller()
	if err := attrs.Apply(attrs.Cred(req.Caller), st.view, req, time.Now().UnixNano()); err != nil {
		return nil, true, err
	}
	if req.Valid&wire.SetMtime != 0 {
		st.mtimeNs = st.view.MtimeNs
	}
	st.pending = append(st.pending, req)
	return st.snapshot(), true, nil
}

// snapshot returns a copy of the client's view of the file.
func (st *fileState) snapshot() *wire.Meta {
	m := proto.CloneOf(st.view)
	m.Size = uint64(st.size)
	if st.mtimeNs != 0 {
		m.MtimeNs = st.mtimeNs
	}
	return m
}

// Handle is an open file.
type Handle struct {
	fs *FS
	st *fileState
	// user carries the handle's number at the servers (User.handle):
	// every request the handle makes goes through its open.
	user User
	cues cue.Set
	// Writable reports whether the handle was opened for writing.
	Writable bool
	// registered delivers whether the primary counted this open, for an
	// open served from the cache (registered in the background); nil
	// when the open was counted before it returned (counted) or by no one.
	registered chan bool
	counted    bool
	obj        oid.ID
	// flags are the open's, for registering it at a new primary.
	flags uint32

	regMu sync.Mutex // one registration at a time, none after the release
	// at is the server known to count the open ("" not known yet).
	at       string
	released bool
}

// newHandle returns a handle of u on id with a number of its own.
func (f *FS) newHandle(u User, cues cue.Set, id oid.ID, writable bool) *Handle {
	u.handle = handleRef{session: f.leases.session, id: f.handles.Add(1)}
	return &Handle{fs: f, user: u, cues: cues, Writable: writable, obj: id}
}

func (f *FS) openState(id oid.ID) *fileState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[id]
}

// overlay returns m as this client sees it: with buffered writes applied.
func (f *FS) overlay(m *wire.Meta) *wire.Meta {
	if m == nil || m.Type != wire.Type_TYPE_FILE {
		return m
	}
	st := f.openState(oid.ID(m.Id))
	if st == nil {
		return m
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.modified {
		return m
	}
	return st.snapshot()
}

// Open opens a file. flags are open(2) flags; the server checks the
// caller's permission for them and records what it granted the handle,
// which its reads, writes and ftruncate then use, whatever the mode
// becomes. Close-to-open: the version comes from the
// primary, or from meta-data cached under a valid lease (a read-only open
// then needs no round trip: its permission is checked here, on the same
// rules, and the primary counts the handle in the background). Cached
// blocks are reused only if the version is unchanged.
func (f *FS) Open(ctx context.Context, u User, cues cue.Set, id oid.ID, flags uint32) (*Handle, *Attr, error) {
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	writable := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	h := f.newHandle(u, cues, id, writable)
	h.flags = flags
	req := &wire.OpenRequest{Caller: h.user.caller(), Id: uint64(id), Flags: flags}
	// Counted as registering before the lease is looked at: a revocation
	// that comes after the look waits for the registration (revoke), so
	// the update behind it (an unlink) finds the open.
	reg := f.startRegistration(id)
	m, ok := f.leases.meta(id, false)
	ok = ok && f.mayServe(u) && f.unlinking.Load() == 0
	var fd *wire.FileData
	// An orphan (no name left; open elsewhere) is opened at the primary:
	// its registration could come after the last handle's release there.
	if ok && !writable && flags&syscall.O_TRUNC == 0 && m.Nlink > 0 && f.dataCached(id, m) {
		if err := perm.Access(attrs.Cred(req.Caller), attrs.Of(m), perm.R); err != nil {
			f.endRegistration(id, reg)
			return nil, nil, fmt.Errorf("open %v: %w", id, err)
		}
		h.registered = f.registerOpen(req, h, reg)
	} else {
		f.endRegistration(id, reg)
		// Compound open: the version check brings what the first reads need.
		req.WantData = perm.OpenAccess(flags)&perm.R != 0 && flags&syscall.O_TRUNC == 0
		resp, tok, err := readLeased(ctx, f, cues, id, wire.StorageClient.Open, req, func(r *wire.OpenResponse) uint64 {
			return r.GetMeta().GetVersion()
		})
		if err != nil && cues.EventualConsistency && unreachable(err) && !writable && f.mayServe(u) {
			if sm, ok := f.leases.meta(id, true); ok {
				resp, err = &wire.OpenResponse{Meta: sm}, nil
			}
		}
		if err != nil {
			return nil, nil, fmt.Errorf("open %v: %w", id, err)
		}
		m, fd = resp.Meta, resp.Data
		// Only the primary counts handles (a backup or the cache did not).
		h.counted, h.at = tok.server != "", tok.server
		f.leases.record(tok, resp.LeaseMs, id, func(c *cached) { c.meta = proto.CloneOf(m) })
	}
	if m.Type == wire.Type_TYPE_DIR && writable {
		h.releaseAt(ctx)
		return nil, nil, fmt.Errorf("open %v for writing: %w", id, fserr.ErrIsDir)
	}
	f.attach(h, m)
	if hashes, ok := f.adoptData(id, fd); ok {
		h.st.adopt(fd.Version, hashes)
	}
	if flags&syscall.O_TRUNC != 0 && h.Writable && m.Type == wire.Type_TYPE_FILE && m.Size > 0 {
		var err error
		m, err = f.setAttr(ctx, u, cues, id, &wire.SetAttrRequest{Valid: wire.SetSize, Size: 0})
		if err != nil {
			h.Release(ctx)
			return nil, nil, err
		}
	}
	f.hold(h)
	return h, attrOf(f.overlay(m)), nil
}

// CreateOpen is open(2) with O_CREAT: it creates a file named name in
// dir with a.Mode (and a.Umask) and opens it with flags, in one
// request. The open of a file it creates gets the access flags ask for
// whatever the file's mode (creat() with mode 0444 returns a writable
// descriptor, as on Linux); a name that exists is opened as Open does
// (with O_EXCL it is ErrExist).
func (f *FS) CreateOpen(ctx context.Context, u User, cues cue.Set, dir oid.ID, name string, a CreateArgs, flags uint32) (*Handle, *Attr, error) {
	if err := checkName(name); err != nil {
		return nil, nil, err
	}
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	h := f.newHandle(u, cues, 0, flags&syscall.O_ACCMODE != syscall.O_RDONLY)
	h.flags = flags
	a.Type, a.Exclusive = TypeFile, flags&syscall.O_EXCL != 0
	req := f.createRequest(h.user, cues, dir, name, a)
	req.OpenAccess = perm.OpenAccess(flags)
	// Its replication overlaps the writes and the commit; close() waits
	// for both (fileState.unsynced). An eventual create answers early anyway.
	req.DeferSync = !cues.EventualConsistency
	resp, err := f.createOwn(ctx, cues, dir, name, req)
	if err != nil {
		return nil, nil, fmt.Errorf("create %q in %v: %w", name, dir, err)
	}
	if !resp.Opened {
		// The name existed, or this was a retry of a create already made.
		oh, a, err := f.Open(ctx, u, cues, oid.ID(resp.Entry.GetId()), flags&^(syscall.O_CREAT|syscall.O_EXCL))
		if err == nil {
			oh.st.addUnsynced(resp.Pending, resp.Lazy)
		}
		return oh, a, err
	}
	// The object's primary counted the open with the create (a backup
	// under .EventualConsistency puts the file in a slice it is primary
	// for), so the release goes there.
	h.obj, h.counted = oid.ID(resp.Meta.Id), true
	if c, ok := f.primaryAtHand(h.obj); ok {
		// Who counted it, by the table at hand: a stale answer only makes
		// reregister count it once more.
		h.at = c.ID
	}
	f.attach(h, resp.Meta)
	h.st.addUnsynced(resp.Pending, resp.Lazy)
	f.hold(h)
	return h, attrOf(f.overlay(resp.Meta)), nil
}

// attach joins h to the state its client shares for the file, which m
// (from the primary or a lease) describes.
func (f *FS) attach(h *Handle, m *wire.Meta) {
	id := h.obj
	f.mu.Lock()
	st := f.files[id]
	if st == nil {
		st = newFileState(id, m)
		if hashes, loaded, ok := f.leases.takeRefs(id, m.Version); ok {
			st.hashes, st.loaded = hashes, loaded
		}
		f.files[id] = st
	}
	st.refs++
	f.mu.Unlock()
	h.st = st

	st.mu.Lock()
	if !st.modified && m.Version != st.version {
		st.reset(m)
	}
	st.eventual = st.eventual || h.cues.EventualConsistency
	st.mu.Unlock()
}

// registration counts the opens of one object being registered at its
// primary in the background; done closes when there are none left.
type registration struct {
	n    int
	done chan struct{}
}

// startRegistration counts an open of id that may be served from the
// cache as being registered; registerOpen or endRegistration ends it.
func (f *FS) startRegistration(id oid.ID) *registration {
	f.regMu.Lock()
	defer f.regMu.Unlock()
	r := f.regs[id]
	if r == nil {
		r = &registration{done: make(chan struct{})}
		f.regs[id] = r
	}
	r.n++
	return r
}

// endRegistration ends one count of r, id's registrations.
func (f *FS) endRegistration(id oid.ID, r *registration) {
	f.regMu.Lock()
	defer f.regMu.Unlock()
	if r.n--; r.n == 0 {
		close(r.done)
		delete(f.regs, id)
	}
}

// registerOpen tells the primary about an open served from the cache, in
// the background, and then ends r (startRegistration); the result says
// whether the primary counted it. Revocations of the object wait for it
// (waitRegistrations), so an unlink the primary is about to apply finds
// the handle and keeps the file as an orphan.
func (f *FS) registerOpen(req *wire.OpenRequest, h *Handle, r *registration) chan bool {
	id := oid.ID(req.Id)
	req.Caller.Session = 0
	req.RegisterOnly = true
	out := make(chan bool, 1)
	go func() {
		ctx, cancel := context.WithTimeout(f.leases.ctx, f.cfg.Timeout)
		defer cancel()
		var asked string
		_, err := callVia(ctx, f, id, wire.StorageClient.Open, req, callOpts{prep: func(c Conn) { asked = c.ID }})
		if err != nil {
			f.log.Warn("open served from the cache was not registered", slog.String("id", id.String()), slog.Any("err", err))
		} else {
			h.regMu.Lock()
			if h.at == "" {
				h.at = asked
			}
			h.regMu.Unlock()
		}
		out <- err == nil
		f.endRegistration(id, r)
	}()
	return out
}

// Version returns the file version this client last saw committed.
func (h *Handle) Version() uint64 {
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	return h.st.version
}

// ID returns the open object's ID.
func (h *Handle) ID() oid.ID { return h.st.id }

// Release drops the handle; the primary counts every handle (Open), so
// each one is released there. The last handle of a file forgets its state.
func (h *Handle) Release(ctx context.Context) {
	f, st := h.fs, h.st
	f.mu.Lock()
	st.refs--
	last := st.refs == 0
	if last {
		delete(f.files, st.id)
	}
	delete(f.held, h)
	f.mu.Unlock()
	if last {
		st.mu.Lock()
		lost := st.modified
		if st.stagedCommit != nil { // nobody can commit them any more
			st.stagedCommit.Stop()
			st.stagedCommit = nil
		}
		if !lost && st.upDone == nil {
			f.leases.keepRefs(st.id, st.version, st.hashes, st.loaded)
		}
		st.mu.Unlock()
		if lost {
			f.log.Error("writes dropped: file released with uncommitted data", slog.String("id", st.id.String()))
		}
	}
	// The primary's count only matters to reclaim unlinked files, and
	// close(2) does not wait for a release (the kernel sends it in the
	// background). A primary in this process gets one try at once, in
	// this request's goroutine: a goroutine per release cost more (spawn,
	// stack growth) than the call. Whatever could wait (a registration
	// in flight, a primary across the network, a refusal while the
	// primary changes) goes to a goroutine, so that it never holds one
	// of the kernel's few background requests.
	if h.registered == nil && h.releaseHere(ctx) {
		return
	}
	go func() {
		h.regMu.Lock() // after a registration at a new primary in flight
		h.released = true
		h.regMu.Unlock()
		ctx, cancel := f.bound(context.WithoutCancel(ctx), h.cues)
		defer cancel()
		h.releaseAt(ctx)
	}()
}

// releaseHere tells a primary in this process, in one try that waits for
// nothing else, that h is gone; false leaves it to the background.
func (h *Handle) releaseHere(ctx context.Context) bool {
	f := h.fs
	c, ok := f.primaryAtHand(h.obj)
	if !ok || !c.InProcess || !h.regMu.TryLock() { // a re-registration in flight
		return false
	}
	h.released = true
	h.regMu.Unlock()
	if !h.counted {
		return true
	}
	ctx, cancel := f.bound(context.WithoutCancel(ctx), h.cues)
	defer cancel()
	_, err := c.Release(ctx, &wire.ReleaseRequest{Id: uint64(h.obj), Handle: h.user.handle.wire()})
	return err == nil
}

// hold remembers h, if a primary counted it (or will: registered), so
// that keepHolding registers it again at the next primary of its slice.
func (f *FS) hold(h *Handle) {
	if !h.counted && h.registered == nil {
		return
	}
	f.mu.Lock()
	f.held[h] = true
	f.mu.Unlock()
}

// heldHandles returns the handles hold remembers.
func (f *FS) heldHandles() []*Handle {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Keys(f.held))
}

// reregister tells primary, the current primary of h's file, about the
// open h when another server counted it: a new primary after a failover
// counts no open made before it, and would otherwise delete the file at
// its unlink under the open (an orphan's holder it knows already). A
// refusal (the mode no longer allows the open's access) leaves the open
// uncounted there, as before; a timeout is tried again next time.
func (f *FS) reregister(h *Handle, primary string) {
	h.regMu.Lock()
	defer h.regMu.Unlock()
	if h.released || h.at == primary {
		return
	}
	if h.registered != nil && h.at == "" {
		return // its registration is still on its way and says where it went
	}
	req := &wire.OpenRequest{Caller: h.user.caller(), Id: uint64(h.obj),
		Flags: h.flags &^ (syscall.O_CREAT | syscall.O_EXCL | syscall.O_TRUNC), RegisterOnly: true}
	ctx, cancel := context.WithTimeout(f.leases.ctx, f.cfg.Timeout)
	defer cancel()
	_, err := call(ctx, f, h.obj, wire.StorageClient.Open, req)
	if err != nil && (errors.Is(err, fserr.ErrTimeout) || errors.Is(err, context.Canceled)) {
		return
	}
	if err != nil {
		f.log.Warn("open not counted at the file's new primary", slog.String("id", h.obj.String()),
			slog.String("primary", primary), slog.Any("err", err))
	}
	h.at = primary
}

// releaseAt tells the primary this handle is gone, if it counted it.
func (h *Handle) releaseAt(ctx context.Context) {
	if h.registered != nil {
		if !<-h.registered {
			return
		}
	} else if !h.counted {
		return
	}
	h.fs.release(ctx, h.obj, h.user.handle)
}

// release tells the primary the open h of id is gone, so its grant ends
// and an unlinked file can be reclaimed.
func (f *FS) release(ctx context.Context, id oid.ID, h handleRef) {
	if _, err := call(ctx, f, id, wire.StorageClient.Release, &wire.ReleaseRequest{Id: uint64(id), Handle: h.wire()}); err != nil {
		f.log.Warn("release failed", slog.String("id", id.String()), slog.Any("err", err))
	}
}

// waitRegistrations waits until opens of ids served from the cache are
// registered at their primary, so an update the primary is about to apply
// (an unlink) sees them.
func (f *FS) waitRegistrations(ids []oid.ID) {
	f.regMu.Lock()
	var chans []chan struct{}
	for _, id := range ids {
		if r := f.regs[id]; r != nil {
			chans = append(chans, r.done)
		}
	}
	f.regMu.Unlock()
	for _, ch := range chans {
		<-ch
	}
}
