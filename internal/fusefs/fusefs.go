// Package fusefs is the thin FUSE adapter over the client core: it maps
// kernel requests to client.FS calls, cue path components to directory
// views, object IDs to stable inode numbers, and errors to errnos, once,
// here at the edge. It is the only package that imports go-fuse.
package fusefs

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/attrs"
	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/mountinfo"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// InfoXattr is the virtual extended attribute that describes an object.
const InfoXattr = "user.wheelfs.info"

// StatsXattr is the virtual extended attribute, on any object, that
// counts the requests this mount's client sent (mountinfo.Stats reads it).
const StatsXattr = mountinfo.StatsXattr

// Options configures a mount.
type Options struct {
	Logger *slog.Logger
	// AttrTimeout is the longest the kernel may cache attributes (less
	// when the core's lease on them ends sooner; a revocation takes them
	// back at once, so it may be as long as the leases). Names are kept under
	// the leases of their directories where the kernel can take them
	// back (names.go); elsewhere every lookup reaches the core.
	AttrTimeout time.Duration
	// AllowOther lets every local user use the mount (set when root mounts).
	AllowOther bool
	// Debug logs every FUSE request.
	Debug bool
}

// Mount mounts core at dir and returns the running server; Unmount it to stop.
func Mount(dir string, core *client.FS, o Options) (*Server, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	r := &root{core: core, log: o.Logger.With("component", "fuse"), groups: map[uint32]groupEntry{},
		maxAttrTimeout: o.AttrTimeout, inodes: inodes{byID: map[oid.ID]map[*node]struct{}{}, byIno: map[uint64]*kernelState{}}, walks: map[uint32]walk{}}
	top := &node{root: r, id: oid.Root}
	r.track(top)
	core.OnRevoke(r.revoked)
	neg, zero := time.Duration(0), time.Duration(0)
	opts := &fs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther:   o.AllowOther,
			FsName:       "wheelfs",
			Name:         "wheelfs",
			MaxWrite:     1 << 20,
			MaxReadAhead: 1 << 20,
			DirectMount:  true,
			// Read replies are in memory already: go-fuse would copy them
			// into a pipe to splice it, and a 1 MiB reply with its header
			// does not fit the default 1 MiB pipe (it then copies again,
			// and logs each time).
			DisableSplice: true,
			// Names from READDIRPLUS take the kernel's epoch when the
			// reply arrives, not when the request left, so a revocation
			// between the two would not take them back (names.go); and
			// without kernel names they are never used.
			DisableReadDirPlus: true,
			Debug:              o.Debug,
			// The kernel checks permissions with the attributes we return
			// (it knows the caller's groups exactly); the server checks again.
			// With FUSE_POSIX_ACL it also applies the access ACLs it reads
			// through getxattr (cached no longer than the attributes), so
			// that an ACL may grant more than the mode; the server stays
			// the authority. FUSE_DONT_MASK leaves the umask to us: a
			// directory's default ACL replaces it (umaskFS).
			//
			// HANDLE_KILLPRIV_V2: the server clears set-id bits on a
			// write, truncate or chown (perm.KillSUID, perm.Chown), so
			// the kernel need not ask for security.capability before
			// each (there are no file capabilities) nor send the mode
			// change itself. A write's kill lands at its commit; exec
			// ignores set-id bits on this nosuid mount anyway.
			Options:           []string{"default_permissions"},
			EnableAcl:         true,
			ExtraCapabilities: fuse.CAP_DONT_MASK | fuse.CAP_HANDLE_KILLPRIV_V2,
			DisableXAttrs:     false,
			// Not go-fuse's: it would also hide the ACLs. Getxattr
			// answers security.capability itself.
			IgnoreSecurityLabels: false,
		},
		// Mode 0 is a mode (open(O_CREAT, 0), chmod 0): without this
		// go-fuse would show it to the kernel as 0644/0755 while the
		// server checks 0, and the two would disagree.
		NullPermissions: true,
		// Zero, not the longest: go-fuse puts its default in place of a
		// zero timeout, and every reply sets its own (root.attrTimeout),
		// zero included.
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &neg,
		RootStableAttr:  &fs.StableAttr{Ino: inode(oid.Root, cue.Set{}), Mode: syscall.S_IFDIR},
	}
	// Mounted with a descriptor of our own where we may (root), so that
	// the kernel can keep names (names.go); else as go-fuse mounts.
	mountPoint := dir
	fd, err := mountOwnFD(dir, &opts.MountOptions)
	if err == nil {
		mountPoint = "/dev/fd/" + strconv.Itoa(fd)
		opts.MountOptions.DirectMount = false
	} else {
		r.log.Debug("mounting through go-fuse; the kernel keeps no names", "err", err)
	}
	server, err := fuse.NewServer(umaskFS{fs.NewNodeFS(top, opts)}, mountPoint, &opts.MountOptions)
	if err != nil {
		if fd >= 0 {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
			unix.Close(fd)
		}
		return nil, err
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		return nil, err // as fs.Mount: the serve loop ends with the failed mount
	}
	s := &Server{Server: server, dir: dir, own: fd >= 0}
	if s.own {
		if err := pollHack(dir); err != nil {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
			return nil, err
		}
		if err := setReadAhead(dir, client.ReadAheadBytes>>10); err != nil {
			r.log.Debug("kernel read-ahead left at its default", "err", err)
		}
		if k := newKernelNames(fd, server.KernelSettings().Minor); k != nil {
			r.names.Store(k)
			go func() { server.Wait(); k.close() }()
		} else {
			r.log.Debug("the kernel cannot take names back (FUSE 7.44 needed); it keeps none")
		}
	}
	return s, nil
}

// Server is a mounted WheelFS: go-fuse's server, unmounted by Unmount.
type Server struct {
	*fuse.Server
	dir string
	own bool // mounted by mountOwnFD, which go-fuse cannot unmount
}

// Unmount unmounts the file system; the serve loop then ends (Wait).
func (s *Server) Unmount() error {
	if !s.own {
		return s.Server.Unmount()
	}
	return unix.Unmount(s.dir, 0)
}

// umaskFS hands the umask of a create, which go-fuse's node API drops, to
// the node in the mode's spare high bits (splitUmask): with FUSE_DONT_MASK
// the kernel sends the mode unmasked, and whether the umask applies
// depends on the directory's default ACL, which the server knows.
type umaskFS struct{ fuse.RawFileSystem }

// umaskSet marks a mode that carries a umask in bits 16-24.
const umaskSet = 1 << 31

func withUmask(mode, umask uint32) uint32 { return mode&0xffff | umaskSet | (umask&0o777)<<16 }

// splitUmask undoes withUmask; umask is nil when mode carries none (the
// kernel then applied it already).
func splitUmask(mode uint32) (uint32, *uint32) {
	if mode&umaskSet == 0 {
		return mode, nil
	}
	umask := mode >> 16 & 0o777
	return mode & 0xffff, &umask
}

func (u umaskFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	in.Mode = withUmask(in.Mode, in.Umask)
	return u.RawFileSystem.Create(cancel, in, name, out)
}

func (u umaskFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	in.Mode = withUmask(in.Mode, in.Umask)
	return u.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (u umaskFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	in.Mode = withUmask(in.Mode, in.Umask)
	return u.RawFileSystem.Mknod(cancel, in, name, out)
}

type root struct {
	core *client.FS
	log  *slog.Logger
	// maxAttrTimeout is the longest the kernel may cache attributes;
	// never longer than the core's lease on them.
	maxAttrTimeout time.Duration

	mu     sync.Mutex
	groups map[uint32]groupEntry // pid -> supplementary groups
	inodes inodes
	walks  map[uint32]walk // thread -> path walk in progress
	// names lets the kernel keep names under leases (names.go); nil
	// where it cannot take them back.
	names atomic.Pointer[kernelNames]
}

// recentChange is how long after a change the kernel is handed no
// attributes of the object: what keeps changing is cheaper to ask for
// again than to take back (a notification per change).
const recentChange = time.Second

// replySlack covers the time between building a reply and the kernel
// taking it in, which starts the kernel's own attribute timeout.
const replySlack = 5 * time.Second

// attrTimeout is how long the kernel may cache the attributes of n in the
// reply being built: no longer than the core's lease, nothing if the lease
// was revoked since the request began (its answer may predate that), and
// nothing for an object that changed within recentChange — caching
// what keeps changing saves little, and every change of what the kernel
// holds costs a notification there. It records the kernel's hold in
// n.kernel before it reads the lease, so that a revocation that
// comes after the read sees it and tells the kernel (revoked). own says
// the reply is to this mount's own change of n, which the core adopted
// into what it caches: that change ended the request's mark, so the mark
// is not checked (a change the core did not adopt left no lease).
func (r *root) attrTimeout(ctx context.Context, n *node, own bool) time.Duration {
	now := time.Now()
	k := n.kernel
	prev := k.until.Load()
	held := max(prev, now.Add(r.maxAttrTimeout+replySlack).UnixNano())
	for !k.until.CompareAndSwap(prev, held) {
		prev = k.until.Load()
		held = max(prev, held)
	}
	t := time.Duration(0)
	if now.Sub(time.Unix(0, k.changedAt.Load())) >= recentChange {
		mark, ok := ctx.Value(markKey{}).(uint64)
		if !ok {
			mark = 0 // no mark: any revocation on record voids the lease
		}
		if own {
			mark = math.MaxUint64
		}
		t = min(r.maxAttrTimeout, r.core.LeaseLeftSince(n.id, mark))
	}
	// Lower the record to what was handed out (a concurrent reply that
	// raised it meanwhile keeps it).
	lowered := prev
	if t > 0 {
		lowered = max(prev, now.Add(t+replySlack).UnixNano())
	}
	k.until.CompareAndSwap(held, lowered)
	return t
}

// markKey carries the core's revocation mark taken when a request began.
type markKey struct{}

type groupEntry struct {
	groups []uint32
	at     time.Time
}

// user returns the calling process's identity, with its supplementary
// groups read from /proc (cached briefly per pid).
func (r *root) user(ctx context.Context) client.User {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return client.User{Uid: 65534, Gid: 65534}
	}
	u := client.User{Uid: c.Uid, Gid: c.Gid, Pid: c.Pid}
	now := time.Now()
	r.mu.Lock()
	e, ok := r.groups[c.Pid]
	r.mu.Unlock()
	if ok && now.Sub(e.at) < time.Second {
		u.Groups = e.groups
		return u
	}
	u.Groups = procGroups(c.Pid)
	r.mu.Lock()
	if len(r.groups) > 4096 {
		clear(r.groups)
	}
	r.groups[c.Pid] = groupEntry{groups: u.Groups, at: now}
	r.mu.Unlock()
	return u
}

func procGroups(pid uint32) []uint32 {
	data, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "Groups:")
		if !ok {
			continue
		}
		var out []uint32
		for _, f := range strings.Fields(rest) {
			if g, err := strconv.ParseUint(f, 10, 32); err == nil {
				out = append(out, uint32(g))
			}
		}
		return out
	}
	return nil
}

// inode derives the inode number of (object, cue set): the object ID itself
// for the plain view, so that every mount of the deployment agrees and
// rename keeps it; a mix of the ID and the cue key for cue views.
func inode(id oid.ID, cues cue.Set) uint64 {
	key := cues.Key()
	if key == "" {
		return uint64(id)
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	ino := uint64(id) ^ h.Sum64()
	if ino == 0 || ino == uint64(oid.Root) {
		ino++
	}
	return ino
}

// errno maps a core error to the errno the kernel sees, logging what the
// application cannot see (I/O errors, timeouts).
func (r *root) errno(op string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	e := fserr.Errno(err)
	switch e {
	case syscall.EIO, syscall.ETIMEDOUT, syscall.EINVAL:
		r.log.Warn("operation failed", "op", op, "errno", e.Error(), "err", err)
	}
	return e
}

func modeType(mode uint32) client.Type {
	if t, ok := attrs.TypeOfMode(mode); ok {
		return t
	}
	return client.TypeFile
}

func fillAttr(m *client.Attr, cues cue.Set, out *fuse.Attr) {
	out.Ino = inode(oid.ID(m.Id), cues)
	out.Size = m.Size
	out.Blocks = (m.Size + 511) / 512
	out.Blksize = 64 << 10
	out.Mode = attrs.TypeBits(m.Type) | m.Mode&0o7777
	out.Nlink = m.Nlink
	out.Uid, out.Gid = m.Uid, m.Gid
	out.Rdev = m.Rdev
	setTime := func(ns int64, sec *uint64, nsec *uint32) {
		*sec = uint64(ns / 1e9)
		*nsec = uint32(ns % 1e9)
	}
	setTime(m.AtimeNs, &out.Atime, &out.Atimensec)
	setTime(m.MtimeNs, &out.Mtime, &out.Mtimensec)
	setTime(m.CtimeNs, &out.Ctime, &out.Ctimensec)
}

func infoJSON(info *client.Info) ([]byte, error) {
	return json.Marshal(info)
}
