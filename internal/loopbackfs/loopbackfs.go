// Package loopbackfs serves go-fuse's loopback file system (a directory
// mirrored through FUSE) as the FUSE ceiling `wheelfs bench` compares
// WheelFS with: by default its files decline FUSE passthrough, so that
// their reads and writes go through this process as WheelFS's do.
package loopbackfs

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Options configures Serve.
type Options struct {
	// AllowOther lets other users in, and then has the kernel check
	// permissions (default_permissions), as go-fuse's example does.
	AllowOther bool
	// Passthrough lets the kernel read and write the backing files
	// itself (FUSE passthrough, root on Linux 6.9 and later): reads and
	// writes then never reach this process. Off, they do, as every
	// read and write of WheelFS reaches its daemon.
	Passthrough bool
	// Debug logs every FUSE request.
	Debug bool
}

// Serve mounts go-fuse's loopback file system of backing at mnt,
// with the options of go-fuse's example (1 s entry and attribute caches,
// modes as they are), and serves it until ctx is done. It is the bench's
// FUSE ceiling, served by this binary so that the bench needs no go-fuse
// source to build; ready is called once the mount answers.
func Serve(ctx context.Context, mnt, backing string, o Options, ready func()) error {
	root, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return fmt.Errorf("loopback of %s: %w", backing, err)
	}
	if !o.Passthrough {
		root = &noPassthroughNode{root.(*fs.LoopbackNode)}
	}
	sec := time.Second
	opts := &fs.Options{
		AttrTimeout:     &sec,
		EntryTimeout:    &sec,
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			AllowOther:  o.AllowOther,
			Debug:       o.Debug,
			DirectMount: os.Getuid() == 0, // no fusermount needed as root
			FsName:      backing,
			Name:        "loopback",
		},
	}
	if o.AllowOther {
		opts.MountOptions.Options = append(opts.MountOptions.Options, "default_permissions")
	}
	server, err := fs.Mount(mnt, root, opts)
	if err != nil {
		return fmt.Errorf("mount loopback at %s: %w", mnt, err)
	}
	if ready != nil {
		ready()
	}
	go func() {
		<-ctx.Done()
		server.Unmount()
	}()
	server.Wait()
	return nil
}

// noPassthroughNode is a loopback node whose files never offer the
// kernel their descriptor, so that their reads and writes come to this
// process; its children are wrapped alike.
type noPassthroughNode struct{ *fs.LoopbackNode }

var (
	_ fs.NodeWrapChilder = (*noPassthroughNode)(nil)
	_ fs.NodeOpener      = (*noPassthroughNode)(nil)
	_ fs.NodeCreater     = (*noPassthroughNode)(nil)
)

func (n *noPassthroughNode) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &noPassthroughNode{ops.(*fs.LoopbackNode)}
}

func (n *noPassthroughNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	return hidePassthrough(fh), fl, errno
}

func (n *noPassthroughNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return ch, hidePassthrough(fh), fl, errno
}

// noPassthroughFile is a loopback file that declines passthrough.
type noPassthroughFile struct{ *fs.LoopbackFile }

func (noPassthroughFile) PassthroughFd() (int, bool) { return -1, false }

func hidePassthrough(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return noPassthroughFile{lf}
	}
	return fh
}
