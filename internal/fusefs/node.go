package fusefs

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/wheelfs/wheelfs/internal/attrs"
	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// node is one object seen through one cue set. A cue component is a node
// for the same object as its parent directory with the cue applied.
type node struct {
	fs.Inode
	root *root
	id   oid.ID
	cues cue.Set
	// version is the file version the kernel's page cache holds.
	version atomic.Uint64
	// kernel is what the kernel may hold of this inode number, born
	// when the node was tracked (notify.go; set by root.track).
	kernel *kernelState
	born   time.Time
	ino    uint64 // the inode number it was tracked under
}

var (
	_ fs.NodeLookuper      = (*node)(nil)
	_ fs.NodeGetattrer     = (*node)(nil)
	_ fs.NodeSetattrer     = (*node)(nil)
	_ fs.NodeCreater       = (*node)(nil)
	_ fs.NodeMkdirer       = (*node)(nil)
	_ fs.NodeMknoder       = (*node)(nil)
	_ fs.NodeSymlinker     = (*node)(nil)
	_ fs.NodeReadlinker    = (*node)(nil)
	_ fs.NodeLinker        = (*node)(nil)
	_ fs.NodeUnlinker      = (*node)(nil)
	_ fs.NodeRmdirer       = (*node)(nil)
	_ fs.NodeRenamer       = (*node)(nil)
	_ fs.NodeReaddirer     = (*node)(nil)
	_ fs.NodeOpener        = (*node)(nil)
	_ fs.NodeStatfser      = (*node)(nil)
	_ fs.NodeGetxattrer    = (*node)(nil)
	_ fs.NodeSetxattrer    = (*node)(nil)
	_ fs.NodeListxattrer   = (*node)(nil)
	_ fs.NodeRemovexattrer = (*node)(nil)
	_ fs.NodeAllocater     = (*node)(nil)
	_ fs.NodeFsyncer       = (*node)(nil)
)

// child returns the inode for m seen with cues, creating it if needed;
// changed says that this request made or linked it.
func (n *node) child(ctx context.Context, name string, m *client.Attr, cues cue.Set, out *fuse.EntryOut, changed bool) *fs.Inode {
	fillAttr(m, cues, &out.Attr)
	id := oid.ID(m.Id)
	out.SetEntryTimeout(n.root.entryTimeout(ctx, n, changed))
	// The inode go-fuse keeps for this name when it is still this
	// object's: another node would be dropped by go-fuse for it anyway.
	ino := n.GetChild(name)
	if ino == nil || ino.StableAttr().Ino != out.Attr.Ino {
		c := &node{root: n.root, id: id, cues: cues}
		ino = n.NewInode(ctx, c, fs.StableAttr{Mode: attrs.TypeBits(m.Type), Ino: out.Attr.Ino})
	}
	got := ino.Operations().(*node)
	n.root.track(got)
	if changed && n.root.core.LeaseLeft(id) == 0 {
		// Made here without a lease: someone else's change would not be
		// seen before the lease it comes with (none).
		got.kernel.changedAt.Store(time.Now().UnixNano())
	}
	out.SetAttrTimeout(n.root.attrTimeout(ctx, got, changed))
	return ino
}

// Lookup implements fs.NodeLookuper. A cue name yields a view of this
// directory with the cue applied; anything else is looked up on the server.
//
// A lookup that fails ends the system call (ENOENT aside: O_CREAT goes on
// with a CREATE), so it ends the walk: the thread's next call must not
// inherit its start.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx, done := n.root.step(ctx, false)
	ino, errno := n.lookup(ctx, name, out)
	if errno != 0 && errno != syscall.ENOENT {
		n.root.endWalk(ctx)
	} else {
		done()
	}
	return ino, errno
}

func (n *node) lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	r := n.root
	u := r.user(ctx)
	if c, ok, err := cue.ParseComponent(name); ok {
		if err != nil {
			r.log.Warn("malformed cue", slog.String("cue", name), slog.Any("err", err))
			return nil, syscall.EINVAL
		}
		cues := n.cues.Apply(c)
		if err := cues.Validate(); err != nil {
			r.log.Warn("malformed cue", slog.String("cue", name), slog.Any("err", err))
			return nil, syscall.EINVAL
		}
		m, err := r.core.GetAttr(ctx, u, cues, n.id)
		if err != nil {
			return nil, r.errno("lookup", err)
		}
		if m.Type != client.TypeDir {
			return nil, syscall.ENOTDIR
		}
		return n.child(ctx, name, m, cues, out, false), 0
	}
	m, err := r.core.Lookup(ctx, u, n.cues, n.id, name)
	if err != nil {
		return nil, r.errno("lookup", err)
	}
	return n.child(ctx, name, m, n.cues, out, false), 0
}

// Getattr implements fs.NodeGetattrer.
//
// Without a handle, a directory's attributes are what the kernel checks
// where a path walk starts (the mount root, the working directory): the
// walk goes on after it, so it neither ends the walk nor waits for the
// directory's primary longer than client.RevalidateTimeout — the cues
// that bound the call come later in the path.
func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var m *client.Attr
	var err error
	if f == nil && n.IsDir() {
		var done func()
		ctx, done = n.root.stepAs(ctx, stepRevalidate)
		defer done()
		m, err = n.root.core.RevalidateAttr(ctx, n.root.user(ctx), n.cues, n.id)
	} else {
		var done func()
		ctx, done = n.root.step(ctx, true)
		defer done()
		m, err = n.root.core.GetAttr(ctx, n.root.user(ctx), n.cues, n.id)
	}
	if err != nil {
		return n.root.errno("getattr", err)
	}
	fillAttr(m, n.cues, &out.Attr)
	out.SetTimeout(n.root.attrTimeout(ctx, n, false))
	return 0
}

// Fsync implements fs.NodeFsyncer for fsync(2) of a directory:
// databases and mail stores call it after creating or renaming a file,
// and an error there is fatal to them. go-fuse asks the node before the
// file handle, so a file's fsync is passed on to its handle here.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := f.(fs.FileFsyncer); ok {
		return h.Fsync(ctx, flags)
	}
	if !n.IsDir() {
		return 0 // no handle of ours: nothing buffered here to commit
	}
	ctx, done := n.root.step(ctx, true)
	defer done()
	if err := n.root.core.SyncDir(ctx, n.root.user(ctx), n.cues, n.id); err != nil {
		return n.root.errno("fsyncdir", err)
	}
	return 0
}

// Setattr implements fs.NodeSetattrer.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	ctx, done := n.root.step(ctx, true)
	defer done()
	req := client.AttrChange{Handle: coreHandle(f)}
	if m, ok := in.GetMode(); ok {
		req.Valid |= client.SetMode
		req.Mode = m & 0o7777
	}
	if v, ok := in.GetUID(); ok {
		req.Valid |= client.SetUID
		req.Uid = v
	}
	if v, ok := in.GetGID(); ok {
		req.Valid |= client.SetGID
		req.Gid = v
	}
	if v, ok := in.GetSize(); ok {
		req.Valid |= client.SetSize
		req.Size = v
	}
	if in.Valid&fuse.FATTR_ATIME != 0 {
		req.Valid |= client.SetAtime
		req.AtimeNow = in.Valid&fuse.FATTR_ATIME_NOW != 0
		req.AtimeNs = int64(in.Atime)*1e9 + int64(in.Atimensec)
	}
	if in.Valid&fuse.FATTR_MTIME != 0 {
		req.Valid |= client.SetMtime
		req.MtimeNow = in.Valid&fuse.FATTR_MTIME_NOW != 0
		req.MtimeNs = int64(in.Mtime)*1e9 + int64(in.Mtimensec)
	}
	m, err := n.root.core.ChangeAttr(ctx, n.root.user(ctx), n.cues, n.id, req)
	if err != nil {
		return n.root.errno("setattr", err)
	}
	fillAttr(m, n.cues, &out.Attr)
	out.SetTimeout(n.root.attrTimeout(ctx, n, true))
	return 0
}

func (n *node) create(ctx context.Context, name string, a client.CreateArgs, out *fuse.EntryOut) (*fs.Inode, *client.Attr, syscall.Errno) {
	m, err := n.root.core.Create(ctx, n.root.user(ctx), n.cues, n.id, name, a)
	if err != nil {
		return nil, nil, n.root.errno("create", err)
	}
	n.root.changedHere(n, nil)
	return n.child(ctx, name, m, n.cues, out, true), m, 0
}

// Create implements fs.NodeCreater: open(2) with O_CREAT, one request
// to the core, so that the open of a file it creates gets the access it
// asks for whatever the new mode (client.FS.CreateOpen).
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ctx, done := n.root.step(ctx, true)
	defer done()
	mode, umask := splitUmask(mode)
	h, m, err := n.root.core.CreateOpen(ctx, n.root.user(ctx), n.cues, n.id, name, client.CreateArgs{Mode: mode & 0o7777, Umask: umask}, flags)
	if err != nil {
		return nil, nil, 0, n.root.errno("create", err)
	}
	n.root.changedHere(n, nil)
	ino := n.child(ctx, name, m, n.cues, out, true)
	ino.Operations().(*node).version.Store(m.Version)
	return ino, &handle{node: ino.Operations().(*node), h: h}, 0, 0
}

// Mkdir implements fs.NodeMkdirer.
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx, done := n.root.step(ctx, true)
	defer done()
	mode, umask := splitUmask(mode)
	ino, _, errno := n.create(ctx, name, client.CreateArgs{Type: client.TypeDir, Mode: mode & 0o7777, Umask: umask}, out)
	return ino, errno
}

// Mknod implements fs.NodeMknoder.
func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx, done := n.root.step(ctx, true)
	defer done()
	mode, umask := splitUmask(mode)
	ino, _, errno := n.create(ctx, name, client.CreateArgs{Type: modeType(mode), Mode: mode & 0o7777, Rdev: dev, Umask: umask}, out)
	return ino, errno
}

// Symlink implements fs.NodeSymlinker.
func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx, done := n.root.step(ctx, true)
	defer done()
	ino, _, errno := n.create(ctx, name, client.CreateArgs{Type: client.TypeSymlink, Mode: 0o777, Target: target}, out)
	return ino, errno
}

// Readlink implements fs.NodeReadlinker.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	ctx, done := n.root.step(ctx, true)
	defer done()
	t, err := n.root.core.Readlink(ctx, n.root.user(ctx), n.cues, n.id)
	if err != nil {
		return nil, n.root.errno("readlink", err)
	}
	return []byte(t), 0
}

// Link implements fs.NodeLinker.
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ctx, done := n.root.step(ctx, true)
	defer done()
	t := target.(*node)
	m, err := n.root.core.Link(ctx, n.root.user(ctx), n.cues, n.id, name, t.id)
	if err != nil {
		return nil, n.root.errno("link", err)
	}
	return n.child(ctx, name, m, n.cues, out, true), 0
}

// Unlink implements fs.NodeUnlinker.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	ctx, done := n.root.step(ctx, true)
	defer done()
	return n.remove(ctx, "unlink", name, false)
}

// remove is unlink or rmdir of name.
func (n *node) remove(ctx context.Context, what, name string, dirOnly bool) syscall.Errno {
	var child *node
	if c := n.GetChild(name); c != nil {
		child, _ = c.Operations().(*node)
	}
	if child != nil {
		ctx = withSyscallInodes(ctx, child.ino)
	}
	if err := n.root.core.Remove(ctx, n.root.user(ctx), n.cues, n.id, name, dirOnly); err != nil {
		return n.root.errno(what, err)
	}
	n.root.changedHere(n, child)
	return 0
}

// Rmdir implements fs.NodeRmdirer.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	ctx, done := n.root.step(ctx, true)
	defer done()
	return n.remove(ctx, "rmdir", name, true)
}

// Rename implements fs.NodeRenamer.
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	ctx, done := n.root.step(ctx, true)
	defer done()
	p := newParent.(*node)
	return n.root.errno("rename", n.root.core.Rename(ctx, n.root.user(ctx), n.cues, n.id, name, p.id, newName, flags))
}

// Readdir implements fs.NodeReaddirer. Cue components never appear.
func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	ctx, done := n.root.step(ctx, true)
	defer done()
	entries, dir, err := n.root.core.ReadDir(ctx, n.root.user(ctx), n.cues, n.id)
	if err != nil {
		return nil, n.root.errno("readdir", err)
	}
	list := make([]fuse.DirEntry, 0, len(entries)+2)
	list = append(list,
		fuse.DirEntry{Name: ".", Ino: inode(n.id, n.cues), Mode: syscall.S_IFDIR},
		fuse.DirEntry{Name: "..", Ino: inode(oid.ID(dir.Parent), n.cues), Mode: syscall.S_IFDIR})
	for _, e := range entries {
		list = append(list, fuse.DirEntry{Name: e.Name, Ino: inode(oid.ID(e.Id), n.cues), Mode: attrs.TypeBits(e.Type)})
	}
	return fs.NewListDirStream(list), 0
}

// Open implements fs.NodeOpener. The kernel keeps its page cache only when
// the version is the one it cached (close-to-open).
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ctx, done := n.root.step(ctx, true)
	defer done()
	h, m, err := n.root.core.Open(ctx, n.root.user(ctx), n.cues, n.id, flags)
	if err != nil {
		return nil, 0, n.root.errno("open", err)
	}
	var fuseFlags uint32
	if n.version.Swap(m.Version) == m.Version {
		fuseFlags |= fuse.FOPEN_KEEP_CACHE
	}
	return &handle{node: n, h: h}, fuseFlags, 0
}

// Statfs implements fs.NodeStatfser.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	ctx, done := n.root.step(ctx, true)
	defer done()
	st, err := n.root.core.StatFS(ctx, n.root.user(ctx), n.cues)
	if err != nil {
		return n.root.errno("statfs", err)
	}
	*out = fuse.StatfsOut{Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail, Files: st.Files,
		Ffree: st.Ffree, Bsize: st.Bsize, NameLen: st.NameLen, Frsize: st.Bsize}
	return 0
}

// Getxattr implements fs.NodeGetxattrer; InfoXattr is computed here.
// security.capability, which the kernel asks for before every write
// (file capabilities are not supported), is absent without a round trip.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr == "security.capability" {
		return 0, syscall.ENODATA
	}
	ctx, done := n.root.step(ctx, true)
	defer done()
	var val []byte
	var err error
	switch attr {
	case InfoXattr:
		var info *client.Info
		if info, err = n.root.core.Info(ctx, n.root.user(ctx), n.cues, n.id); err == nil {
			val, err = infoJSON(info)
		}
	case StatsXattr:
		val, err = json.Marshal(n.root.core.Stats())
	default:
		val, err = n.root.core.GetXattr(ctx, n.root.user(ctx), n.cues, n.id, attr)
	}
	if err != nil {
		return 0, n.root.errno("getxattr", err)
	}
	if len(dest) < len(val) {
		return uint32(len(val)), syscall.ERANGE
	}
	return uint32(copy(dest, val)), 0
}

// Setxattr implements fs.NodeSetxattrer.
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	ctx, done := n.root.step(ctx, true)
	defer done()
	if attr == InfoXattr {
		return syscall.EPERM
	}
	return n.root.errno("setxattr", n.root.core.SetXattr(ctx, n.root.user(ctx), n.cues, n.id, attr, data, flags))
}

// Removexattr implements fs.NodeRemovexattrer.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	ctx, done := n.root.step(ctx, true)
	defer done()
	return n.root.errno("removexattr", n.root.core.RemoveXattr(ctx, n.root.user(ctx), n.cues, n.id, attr))
}

// Listxattr implements fs.NodeListxattrer.
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	ctx, done := n.root.step(ctx, true)
	defer done()
	names, err := n.root.core.ListXattr(ctx, n.root.user(ctx), n.cues, n.id)
	if err != nil {
		return 0, n.root.errno("listxattr", err)
	}
	size := 0
	for _, s := range names {
		size += len(s) + 1
	}
	if len(dest) < size {
		return uint32(size), syscall.ERANGE
	}
	off := 0
	for _, s := range names {
		off += copy(dest[off:], s)
		dest[off] = 0
		off++
	}
	return uint32(size), 0
}

// detach keeps the request's values (the caller) but not its
// cancellation: go-fuse cancels a request when the calling process gets any
// signal, and Go programs get them constantly. Abandoning a commit halfway
// would lose data; every operation is bounded by its deadline instead.
func detach(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// falloc modes (fallocate(2)).
const fallocKeepSize = 0x01

// Allocate implements fs.NodeAllocater. Storage is allocated on write
// (blocks are content-addressed), so fallocate only extends the size, or
// does nothing with FALLOC_FL_KEEP_SIZE; other modes are not supported.
func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	ctx, done := n.root.step(ctx, true)
	defer done()
	switch mode {
	case fallocKeepSize:
		return 0
	case 0:
	default:
		return syscall.EOPNOTSUPP
	}
	u := n.root.user(ctx)
	m, err := n.root.core.GetAttr(ctx, u, n.cues, n.id)
	if err != nil {
		return n.root.errno("fallocate", err)
	}
	if off+size <= m.Size {
		return 0
	}
	_, err = n.root.core.ChangeAttr(ctx, u, n.cues, n.id, client.AttrChange{Valid: client.SetSize, Size: off + size, Handle: coreHandle(f)})
	return n.root.errno("fallocate", err)
}

// handle is an open file.
type handle struct {
	node *node
	h    *client.Handle
}

// coreHandle returns the core's handle of a FUSE file handle (nil for none).
func coreHandle(f fs.FileHandle) *client.Handle {
	if h, ok := f.(*handle); ok {
		return h.h
	}
	return nil
}

var (
	_ fs.FileReader   = (*handle)(nil)
	_ fs.FileWriter   = (*handle)(nil)
	_ fs.FileFlusher  = (*handle)(nil)
	_ fs.FileFsyncer  = (*handle)(nil)
	_ fs.FileReleaser = (*handle)(nil)
)

// Read implements fs.FileReader.
func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	ctx = detach(ctx)
	n, err := h.h.Read(ctx, dest, off)
	if err != nil {
		return nil, h.node.root.errno("read", err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

// Write implements fs.FileWriter.
func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	ctx = detach(ctx)
	n, err := h.h.Write(ctx, data, off)
	if err != nil {
		return uint32(n), h.node.root.errno("write", err)
	}
	return uint32(n), 0
}

// Flush implements fs.FileFlusher: close(2) returns after the commit.
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	ctx = detach(ctx)
	if err := h.h.Flush(ctx); err != nil {
		return h.node.root.errno("flush", err)
	}
	h.syncVersion()
	return 0
}

// Fsync implements fs.FileFsyncer.
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	ctx = detach(ctx)
	if err := h.h.Fsync(ctx); err != nil {
		return h.node.root.errno("fsync", err)
	}
	h.syncVersion()
	return 0
}

// syncVersion records the committed version as the one the page cache
// holds: our own writes went through it. A commit that made a new
// version also set its size and times at the server, after any GETATTR
// the kernel sent while the writes were in flight: the attributes that
// reply handed the kernel (up to the lease) are taken back.
func (h *handle) syncVersion() {
	if !h.h.Writable {
		return
	}
	if v := h.h.Version(); h.node.version.Swap(v) != v {
		h.node.root.invalidate([]oid.ID{h.node.id}, nil)
	}
}

// Release implements fs.FileReleaser.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	ctx = detach(ctx)
	h.h.Release(context.WithoutCancel(ctx))
	return 0
}
