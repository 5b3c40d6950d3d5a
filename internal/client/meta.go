package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/attrs"
	"github.com/wheelfs/wheelfs/internal/perm"

	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// maxNameLen is the longest name a directory accepts (as on ext4).
const maxNameLen = 255

func checkName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("name %q: %w", name, fserr.ErrInvalid)
	case len(name) > maxNameLen:
		return fmt.Errorf("name of %d bytes: %w", len(name), fserr.ErrNameTooLong)
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return fmt.Errorf("name %q: %w", name, fserr.ErrInvalid)
		}
	}
	return nil
}

// Lookup finds name in dir and returns the object's meta-data. A name
// cached under a valid lease on dir (and the child's meta-data under its
// own) needs no server; under .EventualConsistency stale cached entries
// serve when no replica answers in time.
func (f *FS) Lookup(ctx context.Context, u User, cues cue.Set, dir oid.ID, name string) (*Attr, error) {
	return attrResult(f.lookupMeta(ctx, u, cues, dir, name))
}

// lookupMeta is Lookup on wire meta-data.
func (f *FS) lookupMeta(ctx context.Context, u User, cues cue.Set, dir oid.ID, name string) (*wire.Meta, error) {
	if len(name) > maxNameLen {
		return nil, fmt.Errorf("lookup: %w", fserr.ErrNameTooLong)
	}
	if m, err, ok := f.cachedLookup(u, dir, name, false); ok {
		return m, err
	}
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	return f.lookup(ctx, u, cues, dir, name, 0)
}

// lookup is Lookup within the caller's bound.
func (f *FS) lookup(ctx context.Context, u User, cues cue.Set, dir oid.ID, name string, attempt int) (*wire.Meta, error) {
	req := &wire.LookupRequest{Caller: u.caller(), Dir: uint64(dir), Name: name, AbsentOk: true, WantData: true}
	resp, tok, err := readLeased(ctx, f, cues, dir, wire.StorageClient.Lookup, req, func(r *wire.LookupResponse) uint64 {
		if r.Absent {
			return 0 // as ENOENT was: any replica that has the name wins
		}
		return r.GetDir().GetVersion()
	})
	if err != nil && cues.EventualConsistency && unreachable(err) {
		if m, cerr, ok := f.cachedLookup(u, dir, name, true); ok {
			return m, cerr
		}
	}
	if err != nil {
		return nil, fmt.Errorf("lookup %q in %v: %w", name, dir, err)
	}
	f.leases.record(tok, resp.LeaseMs, dir, func(c *cached) {
		if resp.Dir != nil {
			c.meta = resp.Dir
		}
		if resp.Entry != nil {
			if c.entries == nil {
				c.entries = map[string]*wire.Entry{}
			}
			c.entries[name] = resp.Entry
			delete(c.absent, name)
		}
		if resp.Absent {
			delete(c.entries, name)
			c.setAbsent(name)
		}
	})
	if resp.Absent {
		return nil, fmt.Errorf("lookup %q in %v: %w", name, dir, fserr.ErrNotExist)
	}
	if resp.Meta != nil {
		f.leases.record(tok, resp.LeaseMs, oid.ID(resp.Meta.Id), func(c *cached) {
			c.meta, c.xattrs = resp.Meta, newXattrSet(resp.Xattrs)
		})
		f.keepData(oid.ID(resp.Meta.Id), resp.Data)
	}
	if resp.Meta == nil && resp.Entry != nil {
		// The child lives on another primary: ask it.
		m, err := f.getAttr(ctx, u, cues, oid.ID(resp.Entry.Id))
		if errors.Is(err, fserr.ErrNotExist) && attempt < 3 {
			// Replaced (and deleted) between the two questions: the name
			// names another object now.
			return f.lookup(ctx, u, cues, dir, name, attempt+1)
		}
		if err != nil {
			return nil, fmt.Errorf("lookup %q in %v: %w", name, dir, err)
		}
		return f.overlay(m), nil
	}
	return f.overlay(resp.Meta), nil
}

// cachedLookup answers a lookup from the cache: ok is false when it cannot.
// The caller's search permission is checked on the cached directory. A
// missing name is answered (ENOENT) only under a valid lease on the
// directory, never from stale state.
func (f *FS) cachedLookup(u User, dir oid.ID, name string, stale bool) (*wire.Meta, error, bool) {
	if name == ".." || name == "." || !f.mayServe(u) {
		return nil, nil, false
	}
	var d *wire.Meta
	var e *wire.Entry
	if !f.leases.lookup(dir, stale, func(c *cached) bool {
		var known bool
		d = c.meta
		e, known = c.find(name)
		return d != nil && known && (e != nil || f.leases.validLocked(c, time.Now()))
	}) {
		return nil, nil, false
	}
	if err := perm.MayLookup(attrs.Cred(u.caller()), attrs.Of(d)); err != nil {
		return nil, fmt.Errorf("lookup %q in %v: %w", name, dir, err), true
	}
	if e == nil {
		return nil, &fserr.NameError{What: "lookup", Name: name, In: dir, Err: fserr.ErrNotExist}, true
	}
	m, ok := f.leases.meta(oid.ID(e.Id), stale)
	if !ok {
		return nil, nil, false
	}
	return f.overlay(m), nil, true
}

// GetAttr returns an object's current meta-data, including the effect of
// writes this client has buffered but not yet committed.
func (f *FS) GetAttr(ctx context.Context, u User, cues cue.Set, id oid.ID) (*Attr, error) {
	return attrResult(f.getAttrMeta(ctx, u, cues, id))
}

// RevalidateTimeout bounds asking a directory's primary for attributes
// the kernel wants where a path walk starts (the mount root, the working
// directory). Cues later in the path bound the system call, and the
// directory is above them: its primary must not hold the call longer.
// With attributes to fall back on it waits less (RevalidateKnownTimeout),
// leaving the rest of a short bound (.MaxTime=1000) to the path below.
const (
	RevalidateTimeout      = time.Second
	RevalidateKnownTimeout = 250 * time.Millisecond
)

// RevalidateAttr returns directory id's attributes for the start of a
// path walk: from a valid lease; else from the primary within
// RevalidateKnownTimeout if this client knows earlier attributes, or
// RevalidateTimeout if not (or the cues' shorter bound); else, if that
// primary cannot be reached, the last attributes this client knew.
func (f *FS) RevalidateAttr(ctx context.Context, u User, cues cue.Set, id oid.ID) (*Attr, error) {
	limit := RevalidateTimeout
	if f.leases.lookup(id, true, func(c *cached) bool { return c.meta != nil }) {
		limit = RevalidateKnownTimeout
	}
	if cues.MaxTime <= 0 || cues.MaxTime > limit {
		cues.MaxTime = limit
	}
	m, err := f.getAttrMeta(ctx, u, cues, id)
	if err != nil && unreachable(err) && f.mayServe(u) {
		if old, ok := f.leases.meta(id, true); ok {
			return attrResult(f.overlay(old), nil)
		}
	}
	return attrResult(m, err)
}

// getAttrMeta is GetAttr on wire meta-data.
func (f *FS) getAttrMeta(ctx context.Context, u User, cues cue.Set, id oid.ID) (*wire.Meta, error) {
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	m, err := f.getAttr(ctx, u, cues, id)
	if err != nil {
		return nil, err
	}
	return f.overlay(m), nil
}

// getAttr is GetAttr within the caller's bound, without the overlay.
func (f *FS) getAttr(ctx context.Context, u User, cues cue.Set, id oid.ID) (*wire.Meta, error) {
	serve := f.mayServe(u)
	if m, ok := f.leases.meta(id, false); ok && serve {
		return m, nil
	}
	req := &wire.GetAttrRequest{Caller: u.caller(), Id: uint64(id)}
	resp, tok, err := readLeased(ctx, f, cues, id, wire.StorageClient.GetAttr, req, func(r *wire.GetAttrResponse) uint64 {
		return r.GetMeta().GetVersion()
	})
	if err != nil && cues.EventualConsistency && unreachable(err) && serve {
		if m, ok := f.leases.meta(id, true); ok {
			return m, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("getattr %v: %w", id, err)
	}
	f.leases.record(tok, resp.LeaseMs, id, func(c *cached) { c.meta, c.xattrs = resp.Meta, newXattrSet(resp.Xattrs) })
	return proto.CloneOf(resp.Meta), nil
}

// CreateArgs describes a new object.
type CreateArgs struct {
	Type      Type
	Mode      uint32 // permission bits, already umasked unless Umask is set
	Rdev      uint32
	Target    string // symlink target
	Exclusive bool
	// Umask, when set, is the creator's umask, not applied to Mode: the
	// server applies it unless the directory has a default ACL.
	Umask *uint32
}

// Create makes a new file, directory, symlink or special file in dir. The
// persistent cues in cues are recorded on the new object.
func (f *FS) Create(ctx context.Context, u User, cues cue.Set, dir oid.ID, name string, a CreateArgs) (*Attr, error) {
	return attrResult(f.create(ctx, u, cues, dir, name, a))
}

// create is Create on wire meta-data.
func (f *FS) create(ctx context.Context, u User, cues cue.Set, dir oid.ID, name string, a CreateArgs) (*wire.Meta, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	resp, err := f.createOwn(ctx, cues, dir, name, f.createRequest(u, cues, dir, name, a))
	if err != nil {
		return nil, fmt.Errorf("create %q in %v: %w", name, dir, err)
	}
	if resp.Meta == nil && resp.Entry != nil {
		// An existing file on another primary: ask it.
		m, err := f.getAttr(ctx, u, cues, oid.ID(resp.Entry.Id))
		if err != nil {
			return nil, fmt.Errorf("create %q in %v: %w", name, dir, err)
		}
		return m, nil
	}
	return resp.Meta, nil
}

func (f *FS) createRequest(u User, cues cue.Set, dir oid.ID, name string, a CreateArgs) *wire.CreateRequest {
	return &wire.CreateRequest{
		Caller: u.caller(), Dir: uint64(dir), Name: name, Type: a.Type, Mode: a.Mode,
		Rdev: a.Rdev, Target: a.Target, Cues: wireCues(cues, a.Type), Exclusive: a.Exclusive,
		SyncLevel: syncLevel(cues), Origin: f.cfg.Origin, ClientSite: f.cfg.Site,
		Op: rand.Uint64() | 1, Umask: a.Umask,
	}
}

// createOwn sends a create in dir, adopting the change into this client's
// lease on dir (own.go) and keeping the lease on the new object it brings.
func (f *FS) createOwn(ctx context.Context, cues cue.Set, dir oid.ID, name string, req *wire.CreateRequest) (*wire.CreateResponse, error) {
	resp, o, err := updateOwn(ctx, f, cues, dir, wire.StorageClient.Create, req, []oid.ID{dir})
	o.renewMs = resp.GetDirLeaseMs()
	o.end(err == nil, func(_ oid.ID, c *cached) bool {
		return !resp.Existed && adoptEntryChange(c, resp.Dir, name, resp.Entry)
	})
	if err == nil && !resp.Existed {
		f.leases.recordNew(o, resp.LeaseMs, resp.Meta)
	}
	return resp, err
}

// Link adds a hard link name in dir to the object id.
func (f *FS) Link(ctx context.Context, u User, cues cue.Set, dir oid.ID, name string, id oid.ID) (*Attr, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	resp, err := update(ctx, f, cues, dir, wire.StorageClient.Link,
		&wire.LinkRequest{Caller: u.caller(), Dir: uint64(dir), Name: name, Id: uint64(id)})
	f.leases.forget(dir, id)
	if err != nil {
		return nil, fmt.Errorf("link %q in %v to %v: %w", name, dir, id, err)
	}
	return attrOf(resp.Meta), nil
}

// Remove unlinks name from dir: a directory (rmdir) when dirOnly, anything
// but a directory (unlink) otherwise.
func (f *FS) Remove(ctx context.Context, u User, cues cue.Set, dir oid.ID, name string, dirOnly bool) error {
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	ids := []oid.ID{dir}
	child, known := f.cachedChild(dir, name)
	if known {
		// Its lease is dropped here, not called back.
		ids = append(ids, child)
	}
	defer f.unlinkGate(child, known)()
	resp, o, err := updateOwn(ctx, f, cues, dir, wire.StorageClient.Remove, &wire.RemoveRequest{
		Caller: u.caller(), Dir: uint64(dir), Name: name, DirOnly: dirOnly, FileOnly: !dirOnly,
		SyncLevel: syncLevel(cues)}, ids)
	o.renewMs = resp.GetDirLeaseMs()
	o.end(err == nil, func(id oid.ID, c *cached) bool {
		return id == dir && adoptEntryChange(c, resp.Dir, name, nil)
	})
	if err != nil {
		return fmt.Errorf("remove %q in %v: %w", name, dir, err)
	}
	if m := resp.GetMeta(); m != nil && !known {
		f.leases.forget(oid.ID(m.Id)) // as the rename's victim
	}
	f.forgetBlocks(resp.GetMeta())
	return nil
}

// unlinkGate is called before a remove or rename that may unlink victim
// (known: the cache says which object the name is) and its result after
// it. Opens served from the cache are registered at the primary in the
// background: the primary must count those that came before, or the file
// goes with its last name while open. The victim's are waited for, and
// opens until the change is answered go to the primary, which orders
// them with it. (Not all registrations when the victim is unknown: one
// stuck at an unreachable primary would hold up every remove.)
func (f *FS) unlinkGate(victim oid.ID, known bool) (done func()) {
	f.unlinking.Add(1)
	if known {
		f.waitRegistrations([]oid.ID{victim})
	}
	return func() { f.unlinking.Add(-1) }
}

// cachedChild is the object name names in dir as far as the cache knows,
// valid lease or not.
func (f *FS) cachedChild(dir oid.ID, name string) (oid.ID, bool) {
	l := f.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.objs[dir]; c != nil {
		if e, _ := c.find(name); e != nil {
			return oid.ID(e.Id), true
		}
	}
	return 0, false
}

// forgetBlocks drops the cached blocks of a file whose last name went away
// (it may live on while open; its blocks are fetched again if needed).
func (f *FS) forgetBlocks(m *wire.Meta) {
	if m != nil && m.Type == wire.Type_TYPE_FILE && m.Nlink == 0 {
		f.cache.ForgetOwner(m.Id)
	}
}

// Rename moves srcName in srcDir to dstName in dstDir. Flags are
// wire.RenameNoReplace / wire.RenameExchange.
func (f *FS) Rename(ctx context.Context, u User, cues cue.Set, srcDir oid.ID, srcName string, dstDir oid.ID, dstName string, flags uint32) error {
	if err := checkName(dstName); err != nil {
		return err
	}
	// The source directory's primary does the whole rename atomically when
	// it is primary for the destination too; otherwise it answers EXDEV.
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	defer f.unlinkGate(f.cachedChild(dstDir, dstName))()
	resp, err := update(ctx, f, cues, srcDir, wire.StorageClient.Rename, &wire.RenameRequest{
		Caller: u.caller(), SrcDir: uint64(srcDir), SrcName: srcName,
		DstDir: uint64(dstDir), DstName: dstName, Flags: flags})
	forget := []oid.ID{srcDir, dstDir}
	if r := resp.GetReplaced(); r != nil {
		// An open that resolved the name before the rename must not be
		// served from the cache now: the primary knows the file is gone.
		forget = append(forget, oid.ID(r.Id))
	}
	f.leases.forget(forget...)
	if err != nil {
		return fmt.Errorf("rename %q in %v to %q in %v: %w", srcName, srcDir, dstName, dstDir, err)
	}
	f.forgetBlocks(resp.GetReplaced())
	return nil
}

// ChangeAttr changes meta-data; c.Valid says which fields. A size change
// first commits this client's buffered writes so the truncation orders
// after them.
func (f *FS) ChangeAttr(ctx context.Context, u User, cues cue.Set, id oid.ID, c AttrChange) (*Attr, error) {
	if c.Handle != nil {
		u.handle = c.Handle.user.handle // ftruncate: what the open granted decides
	}
	return attrResult(f.setAttr(ctx, u, cues, id, c.request()))
}

// SetAttr is ChangeAttr with the change as a wire request (tests, tools).
func (f *FS) SetAttr(ctx context.Context, u User, cues cue.Set, id oid.ID, req *wire.SetAttrRequest) (*Attr, error) {
	return attrResult(f.setAttr(ctx, u, cues, id, req))
}

// setAttr is ChangeAttr on wire types.
func (f *FS) setAttr(ctx context.Context, u User, cues cue.Set, id oid.ID, req *wire.SetAttrRequest) (*wire.Meta, error) {
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	st := f.openState(id)
	if st != nil && req.Valid&wire.SetSize == 0 {
		if m, ok, err := st.deferAttr(u, req); ok {
			if err != nil {
				return nil, fmt.Errorf("setattr %v: %w", id, err)
			}
			return m, nil
		}
	}
	if st != nil && req.Valid&wire.SetSize != 0 {
		if err := st.flush(ctx, f, u, cues); err != nil {
			return nil, err
		}
	}
	req.Caller = u.caller()
	req.Id = uint64(id)
	req.SyncLevel = syncLevel(cues)
	resp, o, err := updateOwn(ctx, f, cues, id, wire.StorageClient.SetAttr, req, []oid.ID{id})
	o.end(err == nil, func(_ oid.ID, c *cached) bool { return adoptMeta(c, resp.Meta) })
	if err != nil {
		return nil, fmt.Errorf("setattr %v: %w", id, err)
	}
	if st != nil {
		st.updateMeta(resp.Meta, req.Valid&wire.SetSize != 0)
		if req.Valid&wire.SetSize == 0 {
			st.mu.Lock()
			st.lazy = true
			st.mu.Unlock()
		}
	}
	return f.overlay(resp.Meta), nil
}

// ReadDir lists a directory and returns its entries and its own
// meta-data. With the .WholeFile cue the entries' meta-data comes along in
// the same round trips (paper §5.5), in Entry.Attr. A listing read under a
// lease is reused while the lease lasts.
func (f *FS) ReadDir(ctx context.Context, u User, cues cue.Set, dir oid.ID) ([]Entry, *Attr, error) {
	entries, metas, d, err := f.readDir(ctx, u, cues, dir)
	if err != nil {
		return nil, nil, err
	}
	return entriesOf(entries, metas), attrOf(d), nil
}

// readDir is ReadDir on wire types; metas is nil without .WholeFile.
func (f *FS) readDir(ctx context.Context, u User, cues cue.Set, dir oid.ID) ([]*wire.Entry, []*wire.Meta, *wire.Meta, error) {
	for range 2 {
		if entries, metas, d, err, ok := f.cachedListing(u, dir, cues.WholeFile); ok {
			return entries, metas, d, err
		}
		// A .WholeFile prefetch of this directory under way: its answer
		// will be cached.
		if !f.waitListing(ctx, dir) {
			break
		}
	}
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	return f.fetchDir(ctx, u, cues, dir)
}

// cachedListing is cachedList, with the entries' meta-data under
// .WholeFile (all of it leased, or ok is false).
func (f *FS) cachedListing(u User, dir oid.ID, whole bool) ([]*wire.Entry, []*wire.Meta, *wire.Meta, error, bool) {
	entries, d, err, ok := f.cachedList(u, dir, false)
	if !ok || err != nil || !whole {
		return entries, nil, d, err, ok
	}
	metas := make([]*wire.Meta, 0, len(entries))
	for _, e := range entries {
		m, ok := f.leases.meta(oid.ID(e.Id), false)
		if !ok {
			return nil, nil, nil, nil, false
		}
		metas = append(metas, m)
	}
	return entries, metas, d, nil, true
}

// fetchDir reads a listing from the directory's primary, within ctx.
// Under .WholeFile the subdirectories' listings follow in the background
// (prefetchTree), so a walk of the subtree finds them cached.
func (f *FS) fetchDir(ctx context.Context, u User, cues cue.Set, dir oid.ID) ([]*wire.Entry, []*wire.Meta, *wire.Meta, error) {
	var entries []*wire.Entry
	var metas []*wire.Meta
	var d *wire.Meta
	after := ""
	var first leaseToken
	var sum *wire.XattrSummary
	lease := uint32(0)
	for page := 0; ; page++ {
		req := &wire.ReadDirRequest{Caller: u.caller(), Dir: uint64(dir), After: after, Limit: 1024, WithMeta: cues.WholeFile,
			Plus: page < plusPages && !f.cfg.NoLeases}
		resp, tok, err := readLeased(ctx, f, cues, dir, wire.StorageClient.ReadDir, req, func(r *wire.ReadDirResponse) uint64 {
			return r.GetDir().GetVersion()
		})
		if err != nil && cues.EventualConsistency && unreachable(err) && !cues.WholeFile {
			if entries, d, cerr, ok := f.cachedList(u, dir, true); ok {
				return entries, nil, d, cerr
			}
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("readdir %v: %w", dir, err)
		}
		if page == 0 {
			first, lease, sum = tok, resp.LeaseMs, resp.DirXattrs
		} else if tok.chanGen != first.chanGen || resp.LeaseMs == 0 {
			lease = 0
		}
		entries = append(entries, resp.Entries...)
		metas = append(metas, resp.Metas...)
		f.recordPlus(tok, resp)
		d = resp.Dir
		if resp.Eof || len(resp.Entries) == 0 {
			break
		}
		after = resp.Entries[len(resp.Entries)-1].Name
	}
	sorted := slices.IsSortedFunc(entries, func(a, b *wire.Entry) int { return strings.Compare(a.Name, b.Name) })
	f.leases.record(first, lease, dir, func(c *cached) {
		c.meta, c.list, c.listEdits, c.listed, c.sorted, c.listOwned = d, entries, nil, true, sorted, false
		if x := newXattrSet(sum); x != nil && x.version == d.GetVersion() {
			c.xattrs = x
		}
	})
	if cues.WholeFile {
		f.prefetchTree(ctx, u, cues, entries)
	}
	return entries, metas, d, nil
}

// recordPlus keeps the entries' meta-data and xattr summaries that a
// readdir-plus page brought under their lease, so that the lookups,
// stats and getxattrs that follow a listing (`ls -l`) need no server.
func (f *FS) recordPlus(tok leaseToken, resp *wire.ReadDirResponse) {
	if resp.MetasLeaseMs == 0 || len(resp.Xattrs) != len(resp.Metas) {
		return
	}
	for i, m := range resp.Metas {
		x := newXattrSet(resp.Xattrs[i])
		if x != nil && x.version != m.Version {
			x = nil
		}
		f.leases.record(tok, resp.MetasLeaseMs, oid.ID(m.Id), func(c *cached) { c.meta, c.xattrs = m, x })
		if len(resp.Datas) == len(resp.Metas) && resp.Datas[i].Version == m.Version {
			f.keepData(oid.ID(m.Id), resp.Datas[i]) // .WholeFile: small files' contents
		}
	}
}

// cachedList answers a listing from the cache (ok false: it cannot),
// checking the caller's read permission on the cached directory.
func (f *FS) cachedList(u User, dir oid.ID, stale bool) ([]*wire.Entry, *wire.Meta, error, bool) {
	if !f.mayServe(u) {
		return nil, nil, nil, false
	}
	var d *wire.Meta
	var list []*wire.Entry
	if !f.leases.lookup(dir, stale, func(c *cached) bool {
		if !c.listed || c.meta == nil {
			return false
		}
		// Copied under the lock: an unsorted listing is edited in place.
		d, list = c.meta, slices.Clone(c.listing())
		return true
	}) {
		return nil, nil, nil, false
	}
	if err := perm.Access(attrs.Cred(u.caller()), attrs.Of(d), perm.R); err != nil {
		return nil, nil, fmt.Errorf("readdir %v: %w", dir, err), true
	}
	return list, proto.CloneOf(d), nil, true
}

// Readlink returns a symlink's target.
func (f *FS) Readlink(ctx context.Context, u User, cues cue.Set, id oid.ID) (string, error) {
	m, err := f.GetAttr(ctx, u, cues, id)
	if err != nil {
		return "", err
	}
	if m.Type != wire.Type_TYPE_SYMLINK {
		return "", fmt.Errorf("readlink %v: %w", id, fserr.ErrInvalid)
	}
	return m.Target, nil
}

// StatFS reports capacity, as seen by the primary of the root slice.
func (f *FS) StatFS(ctx context.Context, u User, cues cue.Set) (*StatFS, error) {
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	resp, err := call(ctx, f, oid.Root, wire.StorageClient.StatFS, &wire.StatFSRequest{Caller: u.caller()})
	if err != nil {
		return nil, fmt.Errorf("statfs: %w", err)
	}
	return &StatFS{Blocks: resp.Blocks, Bfree: resp.Bfree, Bavail: resp.Bavail, Files: resp.Files,
		Ffree: resp.Ffree, Bsize: resp.Bsize, NameLen: resp.NameLen}, nil
}

// GetXattr returns an extended attribute's value. While this client holds
// a lease on the object's meta-data with the summary of its attributes,
// the answer (ENODATA included) needs no server; a value too large for the
// summary is asked for once and then kept under the lease too.
func (f *FS) GetXattr(ctx context.Context, u User, cues cue.Set, id oid.ID, name string) ([]byte, error) {
	if v, err, ok := f.cachedXattr(u, id, name, false); ok {
		return v, err
	}
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	req := &wire.XattrRequest{Caller: u.caller(), Id: uint64(id), Name: name, AbsentOk: true}
	resp, tok, err := readLeased(ctx, f, cues, id, wire.StorageClient.GetXattr, req, xattrVersion)
	if err != nil && cues.EventualConsistency && unreachable(err) {
		if v, cerr, ok := f.cachedXattr(u, id, name, true); ok {
			return v, cerr
		}
	}
	if err != nil {
		return nil, fmt.Errorf("getxattr %q of %v: %w", name, id, err)
	}
	f.recordXattrs(tok, id, resp, name)
	if resp.Absent {
		return nil, fmt.Errorf("getxattr %q of %v: %w", name, id, fserr.ErrNoAttr)
	}
	return resp.Value, nil
}

// xattrVersion orders replicas' answers to an xattr read; a missing
// attribute counts as version 0, as ENODATA did.
func xattrVersion(r *wire.XattrResponse) uint64 {
	if r.Absent {
		return 0
	}
	return r.GetMeta().GetVersion()
}

// recordXattrs keeps the meta-data and xattr summary an xattr read
// brought, with the value of name when it was read (and not absent).
func (f *FS) recordXattrs(tok leaseToken, id oid.ID, resp *wire.XattrResponse, name string) {
	if resp.Meta == nil {
		return
	}
	f.leases.record(tok, resp.LeaseMs, id, func(c *cached) {
		c.meta, c.xattrs = resp.Meta, newXattrSet(resp.Xattrs)
		if c.xattrs != nil && name != "" && !resp.Absent && c.xattrs.has(name) {
			c.xattrs = c.xattrs.withValue(name, resp.Value)
		}
	})
}

// cachedXattr answers getxattr from the cache: ok is false when it
// cannot. The caller's permission is checked first, as the server does.
func (f *FS) cachedXattr(u User, id oid.ID, name string, stale bool) ([]byte, error, bool) {
	m, x, ok := f.leases.xattrs(id, stale)
	if !ok || !f.mayServe(u) {
		return nil, nil, false
	}
	if err := perm.MayGetXattr(attrs.Cred(u.caller()), attrs.Of(m), name); err != nil {
		return nil, fmt.Errorf("getxattr %q of %v: %w", name, id, err), true
	}
	if !x.has(name) {
		return nil, fmt.Errorf("getxattr %q of %v: %w", name, id, fserr.ErrNoAttr), true
	}
	v, known := x.values[name]
	if !known {
		return nil, nil, false
	}
	return slices.Clone(v), nil, true
}

// ListXattr returns the names of an object's extended attributes, from
// the leased summary when there is one.
func (f *FS) ListXattr(ctx context.Context, u User, cues cue.Set, id oid.ID) ([]string, error) {
	if names, ok := f.cachedXattrNames(u, id, false); ok {
		return names, nil
	}
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	resp, tok, err := readLeased(ctx, f, cues, id, wire.StorageClient.ListXattr,
		&wire.XattrRequest{Caller: u.caller(), Id: uint64(id)}, xattrVersion)
	if err != nil && cues.EventualConsistency && unreachable(err) {
		if names, ok := f.cachedXattrNames(u, id, true); ok {
			return names, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("listxattr %v: %w", id, err)
	}
	f.recordXattrs(tok, id, resp, "")
	return resp.Names, nil
}

// cachedXattrNames lists the names the caller sees, from the cache.
func (f *FS) cachedXattrNames(u User, id oid.ID, stale bool) ([]string, bool) {
	_, x, ok := f.leases.xattrs(id, stale)
	if !ok || !f.mayServe(u) {
		return nil, false
	}
	c := attrs.Cred(u.caller())
	var names []string
	for _, n := range x.names {
		if perm.ListXattrVisible(c, n) {
			names = append(names, n)
		}
	}
	return names, true
}

// SetXattr sets an extended attribute. Flags are XATTR_CREATE/XATTR_REPLACE.
func (f *FS) SetXattr(ctx context.Context, u User, cues cue.Set, id oid.ID, name string, value []byte, flags uint32) error {
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	_, err := update(ctx, f, cues, id, wire.StorageClient.SetXattr,
		&wire.XattrRequest{Caller: u.caller(), Id: uint64(id), Name: name, Value: value, Flags: flags})
	f.leases.forget(id)
	if err != nil {
		return fmt.Errorf("setxattr %q of %v: %w", name, id, err)
	}
	return nil
}

// RemoveXattr removes an extended attribute.
func (f *FS) RemoveXattr(ctx context.Context, u User, cues cue.Set, id oid.ID, name string) error {
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	_, err := update(ctx, f, cues, id, wire.StorageClient.RemoveXattr,
		&wire.XattrRequest{Caller: u.caller(), Id: uint64(id), Name: name})
	f.leases.forget(id)
	if err != nil {
		return fmt.Errorf("removexattr %q of %v: %w", name, id, err)
	}
	return nil
}

// Info describes an object's identity and placement (`wheelfs info`,
// the user.wheelfs.info xattr).
type Info struct {
	ID       string         `json:"id"`
	Slice    uint32         `json:"slice"`
	Type     string         `json:"type"`
	Version  uint64         `json:"version"`
	Size     uint64         `json:"size"`
	Primary  ServerRef      `json:"primary"`
	Replicas []ServerRef    `json:"replicas"`
	Epoch    int64          `json:"epoch"`
	Cues     map[string]any `json:"cues"`
}

// Info returns the identity and placement of id.
func (f *FS) Info(ctx context.Context, u User, cues cue.Set, id oid.ID) (*Info, error) {
	m, err := f.getAttrMeta(ctx, u, cues, id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := f.bound(ctx, cues)
	defer cancel()
	si, err := f.router.Describe(ctx, id.Slice())
	if err != nil {
		return nil, fmt.Errorf("describe slice of %v: %w", id, err)
	}
	return &Info{
		ID:       fmt.Sprintf("%016x", uint64(id)),
		Slice:    uint32(id.Slice()),
		Type:     typeName(m.Type),
		Version:  m.Version,
		Size:     m.Size,
		Primary:  si.Primary,
		Replicas: si.Replicas,
		Epoch:    si.Epoch,
		Cues:     CuesMap(m.Cues),
	}, nil
}

// CuesMap renders persistent cues as JSON-friendly values ({"RepLevel": 2}).
func CuesMap(c *wire.Cues) map[string]any {
	out := map[string]any{}
	if c == nil {
		return out
	}
	if c.Site != "" {
		out["Site"] = c.Site
	}
	if c.KeepTogether {
		out["KeepTogether"] = true
	}
	if c.RepSites > 0 {
		out["RepSites"] = c.RepSites
	}
	if c.RepLevel > 0 {
		out["RepLevel"] = c.RepLevel
	}
	if c.Eventual {
		out["EventualConsistency"] = true
	}
	return out
}

func typeName(t wire.Type) string {
	switch t {
	case wire.Type_TYPE_FILE:
		return "file"
	case wire.Type_TYPE_DIR:
		return "dir"
	case wire.Type_TYPE_SYMLINK:
		return "symlink"
	default:
		return "special"
	}
}
