package server_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestLimits sends requests over the limits (wire/limits.go) from a
// client node over TLS and checks Linux's errno for each; requests at
// the limit pass.
func TestLimits(t *testing.T) {
	r := startRig(t, func(c *deploy.Config) { c.TrustClientUIDs = true })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := r.dial(t, "limits-client")
	sc := wire.NewStorageClient(conn)
	fs, u := r.h.Client, client.User{}
	if err := fs.WriteFile(ctx, u, "/f", []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	fa, err := fs.Lookup(ctx, u, client.NoCues, oid.Root, "f")
	if err != nil {
		t.Fatal(err)
	}
	root, f := uint64(oid.Root), fa.Id
	c := &wire.Caller{}
	long := strings.Repeat("n", wire.NameMax+1)
	hash := make([]byte, 32)
	many := func(n, size int) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			out[i] = make([]byte, size)
		}
		return out
	}
	tests := []struct {
		name string
		call func() error
		want syscall.Errno
	}{
		{"lookup of a long name", func() error {
			_, err := sc.Lookup(ctx, &wire.LookupRequest{Caller: c, Dir: root, Name: long})
			return err
		}, syscall.ENAMETOOLONG},
		{"create of NAME_MAX bytes", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Name: long[1:], Type: wire.Type_TYPE_FILE})
			return err
		}, 0},
		{"create of a long name", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Name: long, Type: wire.Type_TYPE_FILE})
			return err
		}, syscall.ENAMETOOLONG},
		{"create with a slash", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Name: "a/b", Type: wire.Type_TYPE_FILE})
			return err
		}, syscall.EINVAL},
		{"create with a NUL", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Name: "a\x00b", Type: wire.Type_TYPE_FILE})
			return err
		}, syscall.EINVAL},
		{"mkdir ..", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Name: "..", Type: wire.Type_TYPE_DIR})
			return err
		}, syscall.EINVAL},
		{"create of an empty name", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Type: wire.Type_TYPE_FILE})
			return err
		}, syscall.EINVAL},
		{"symlink to PATH_MAX-1 bytes", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Name: "l1", Type: wire.Type_TYPE_SYMLINK, Target: strings.Repeat("t", wire.PathMax-1)})
			return err
		}, 0},
		{"symlink to PATH_MAX bytes", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Name: "l2", Type: wire.Type_TYPE_SYMLINK, Target: strings.Repeat("t", wire.PathMax)})
			return err
		}, syscall.ENAMETOOLONG},
		{"symlink to nothing", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Name: "l3", Type: wire.Type_TYPE_SYMLINK})
			return err
		}, syscall.ENOENT},
		{"file with a target", func() error {
			_, err := sc.Create(ctx, &wire.CreateRequest{Caller: c, Dir: root, Name: "l4", Type: wire.Type_TYPE_FILE, Target: "x"})
			return err
		}, syscall.EINVAL},
		{"rename to .", func() error {
			_, err := sc.Rename(ctx, &wire.RenameRequest{Caller: c, SrcDir: root, SrcName: "f", DstDir: root, DstName: "."})
			return err
		}, syscall.EINVAL},
		{"link with a long name", func() error {
			_, err := sc.Link(ctx, &wire.LinkRequest{Caller: c, Dir: root, Name: long, Id: f})
			return err
		}, syscall.ENAMETOOLONG},
		{"xattr name of 256 bytes", func() error {
			_, err := sc.SetXattr(ctx, &wire.XattrRequest{Caller: c, Id: f, Name: "user." + long[5:], Value: []byte("v")})
			return err
		}, syscall.ERANGE},
		{"xattr value of XATTR_SIZE_MAX", func() error {
			_, err := sc.SetXattr(ctx, &wire.XattrRequest{Caller: c, Id: f, Name: "user.max", Value: make([]byte, wire.XattrSizeMax)})
			return err
		}, 0},
		{"xattr value above XATTR_SIZE_MAX", func() error {
			_, err := sc.SetXattr(ctx, &wire.XattrRequest{Caller: c, Id: f, Name: "user.big", Value: make([]byte, wire.XattrSizeMax+1)})
			return err
		}, syscall.E2BIG},
		{"PutBlocks of too many blocks", func() error {
			_, err := sc.PutBlocks(ctx, &wire.PutBlocksRequest{Caller: c, Id: f, Data: many(wire.MaxBlocksPerCall+1, 1)})
			return err
		}, syscall.E2BIG},
		{"ReadBlocks of too many blocks", func() error {
			_, err := sc.ReadBlocks(ctx, &wire.ReadBlocksRequest{Caller: c, Id: f, Hashes: many(wire.MaxBlocksPerCall+1, 32)})
			return err
		}, syscall.E2BIG},
		{"GetBlocks of too many references", func() error {
			_, err := sc.GetBlocks(ctx, &wire.GetBlocksRequest{Caller: c, Id: f, Count: wire.MaxBlockRefs + 1})
			return err
		}, syscall.E2BIG},
		{"truncate to a negative size", func() error {
			_, err := sc.SetAttr(ctx, &wire.SetAttrRequest{Caller: c, Id: f, Valid: wire.SetSize, Size: 1 << 63})
			return err
		}, syscall.EINVAL},
		{"truncate beyond the largest file", func() error {
			_, err := sc.SetAttr(ctx, &wire.SetAttrRequest{Caller: c, Id: f, Valid: wire.SetSize, Size: wire.MaxFileSize + 1})
			return err
		}, syscall.EFBIG},
		{"commit of a block beyond the largest file", func() error {
			_, err := sc.Commit(ctx, &wire.CommitRequest{Caller: c, Id: f, Size: 4, Blocks: []*wire.BlockRef{{Index: 1 << 50, Hash: hash}}})
			return err
		}, syscall.EFBIG},
		{"commit with a short hash", func() error {
			_, err := sc.Commit(ctx, &wire.CommitRequest{Caller: c, Id: f, Size: 4, Blocks: []*wire.BlockRef{{Index: 0, Hash: hash[:5]}}})
			return err
		}, syscall.EINVAL},
	}
	for _, tt := range tests {
		err := tt.call()
		if got := fserr.Errno(fserr.FromStatus(err)); got != tt.want {
			t.Errorf("%s: errno %v (%v), want %v", tt.name, got, err, tt.want)
		}
	}

	// A message over the server's MaxMessageSize is refused by gRPC before
	// any handler (the client's own bound is lifted for this call).
	_, err = sc.PutBlocks(ctx, &wire.PutBlocksRequest{Caller: c, Id: f, Data: [][]byte{make([]byte, wire.MaxMessageSize)}},
		grpc.MaxCallSendMsgSize(2*wire.MaxMessageSize))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "larger than max") {
		t.Errorf("a message over the size limit: %v, want ResourceExhausted from the server", err)
	}

	// Attributes of one object are bounded together: ENOSPC, as ext4.
	var full error
	for i := 0; i < 20 && full == nil; i++ {
		_, full = sc.SetXattr(ctx, &wire.XattrRequest{Caller: c, Id: root, Name: fmt.Sprintf("user.%d", i), Value: make([]byte, wire.XattrSizeMax)})
	}
	if fserr.Errno(fserr.FromStatus(full)) != syscall.ENOSPC {
		t.Errorf("attributes beyond %d bytes: %v, want ENOSPC", wire.XattrTotalMax, full)
	}
	if _, err := sc.SetXattr(ctx, &wire.XattrRequest{Caller: c, Id: root, Name: "user.0", Value: []byte("smaller")}); err != nil {
		t.Errorf("replacing an attribute of a full object with a smaller value: %v", err)
	}
	r.alive(t, r.dialWith(t, r.h.Creds))
}

// TestListingBounded checks that a listing whose entries and meta-data
// exceed MaxListBytes comes in several answers, which together hold
// every entry once.
func TestListingBounded(t *testing.T) {
	r := startRig(t, func(c *deploy.Config) { c.TrustClientUIDs = true })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fs, u := r.h.Client, client.User{}
	target := strings.Repeat("t", wire.PathMax-1)
	const n = 400 // 400 × 4 KiB of targets: more than MaxListBytes
	for i := range n {
		if _, err := fs.Create(ctx, u, client.NoCues, oid.Root, fmt.Sprintf("l%03d", i), client.CreateArgs{Type: client.TypeSymlink, Target: target}); err != nil {
			t.Fatal(err)
		}
	}
	sc := wire.NewStorageClient(r.dial(t, "list-client"))
	var names []string
	answers := 0
	for after := ""; ; answers++ {
		resp, err := sc.ReadDir(ctx, &wire.ReadDirRequest{Caller: &wire.Caller{}, Dir: uint64(oid.Root), After: after, WithMeta: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Metas) != len(resp.Entries) {
			t.Fatalf("%d entries with %d metas", len(resp.Entries), len(resp.Metas))
		}
		for i, e := range resp.Entries {
			if resp.Metas[i].Id != e.Id {
				t.Fatalf("meta %d is of %x, entry of %x", i, resp.Metas[i].Id, e.Id)
			}
			names = append(names, e.Name)
		}
		if resp.Eof {
			break
		}
		after = resp.Entries[len(resp.Entries)-1].Name
	}
	t.Logf("%d names in %d answers", len(names), answers+1)
	if answers < 1 || len(names) != n || names[0] != "l000" || names[n-1] != fmt.Sprintf("l%03d", n-1) {
		t.Fatalf("%d names in %d answers, want %d in at least 2", len(names), answers+1, n)
	}
}
