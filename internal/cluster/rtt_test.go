package cluster

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/oid"
)

// Round trips of single operations across the wide area (issue 11,
// items 2 and 3). The helpers below issue what the kernel sends for a
// system call through a mount: a lookup per path component, then the
// operation.

// walkTo looks path up component by component from the root.
func walkTo(ctx context.Context, fs *client.FS, path string) (*client.Attr, oid.ID, error) {
	dir := oid.Root
	var a *client.Attr
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, name := range parts {
		var err error
		a, err = fs.Lookup(ctx, Owner(), client.NoCues, dir, name)
		if err != nil {
			return nil, dir, err
		}
		if i < len(parts)-1 {
			dir = oid.ID(a.Id)
		}
	}
	return a, dir, nil
}

// catFile reads path as cat(1) does: lookups, open, reads to EOF, close.
func catFile(ctx context.Context, fs *client.FS, path string) ([]byte, error) {
	a, _, err := walkTo(ctx, fs, path)
	if err != nil {
		return nil, err
	}
	h, _, err := fs.Open(ctx, Owner(), client.NoCues, oid.ID(a.Id), syscall.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer h.Release(ctx)
	var out []byte
	buf := make([]byte, 128<<10)
	for off := int64(0); ; {
		n, err := h.Read(ctx, buf, off)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return out, nil
		}
		out = append(out, buf[:n]...)
		off += int64(n)
	}
}

// createFile writes a new file as `cat > path` does: lookups (the last
// one misses), create+open, write, close.
func createFile(ctx context.Context, fs *client.FS, path string, data []byte) error {
	_, dir, err := walkTo(ctx, fs, path)
	if err == nil {
		return fmt.Errorf("%s exists", path)
	} else if !isNotExist(err) {
		return err
	}
	name := path[strings.LastIndex(path, "/")+1:]
	h, _, err := fs.CreateOpen(ctx, Owner(), client.NoCues, dir, name, 0o644, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_TRUNC)
	if err != nil {
		return err
	}
	defer h.Release(ctx)
	if _, err := h.Write(ctx, data, 0); err != nil {
		return err
	}
	return h.Flush(ctx)
}

// TestRoundTripCounts prints what each operation costs today.
func TestRoundTripCounts(t *testing.T) {
	t.Parallel()
	const rtt = 100 * time.Millisecond
	c := Start(t, Options{RTT: UniformRTT(rtt), LockTTL: 10 * time.Second})
	ctx := opCtx(t)
	west, east := c.Client("west"), c.Client("east")
	if _, err := west.Mkdir(ctx, Owner(), "/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := createFile(ctx, west, "/d/warmup", []byte("w")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := lsLR(ctx, east, mustID(t, east, "/d")); err != nil {
			t.Fatal(err)
		}
	}
	data := bytes.Repeat([]byte("x"), 64<<10)
	var err error
	start := time.Now()
	n := calls(west, func() { err = createFile(ctx, west, "/d/f", data) })
	t.Logf("create+write+close at west (east leases /d): %v %v err=%v", time.Since(start), n.Calls, err)
	start = time.Now()
	var got []byte
	n = calls(east, func() { got, err = catFile(ctx, east, "/d/f") })
	t.Logf("cold read at east: %v %v err=%v ok=%v", time.Since(start), n.Calls, err, bytes.Equal(got, data))
	start = time.Now()
	n = calls(east, func() { got, err = catFile(ctx, east, "/d/f") })
	t.Logf("warm read at east: %v %v err=%v ok=%v", time.Since(start), n.Calls, err, bytes.Equal(got, data))
	start = time.Now()
	n = calls(west, func() { err = createFile(ctx, west, "/d/g", data) })
	t.Logf("create+write+close at west (east leases /d and f): %v %v err=%v", time.Since(start), n.Calls, err)
	start = time.Now()
	var k int
	n = calls(east, func() { k, err = lsLR(ctx, east, mustID(t, east, "/d")) })
	t.Logf("ls -la at east after create: %v %v err=%v n=%d", time.Since(start), n.Calls, err, k)
	start = time.Now()
	n = calls(east, func() { k, err = lsLR(ctx, east, mustID(t, east, "/d")) })
	t.Logf("ls -la at east again: %v %v err=%v n=%d", time.Since(start), n.Calls, err, k)
}
