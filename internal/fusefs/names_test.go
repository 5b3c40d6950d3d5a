package fusefs

import (
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// The name cache sends an epoch only when the kernel may hold names of a
// changed directory, as the bare header the kernel reads (a pipe stands
// in for /dev/fuse); TestCrossMountCoherence checks it in the kernel.
func TestKernelNamesEpoch(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if newKernelNames(p[1], 43) != nil {
		t.Fatal("names kept on a kernel without FUSE 7.44")
	}
	epochs := func() int {
		var buf [256]byte
		n, err := unix.Read(p[0], buf[:])
		if err == unix.EAGAIN {
			return 0
		}
		if err != nil || n%16 != 0 {
			t.Fatalf("read %d bytes: %v", n, err)
		}
		for i := 0; i < n; i += 16 {
			h := buf[i : i+16]
			if binary.LittleEndian.Uint32(h) != 16 || binary.LittleEndian.Uint32(h[4:]) != notifyIncEpoch ||
				binary.LittleEndian.Uint64(h[8:]) != 0 {
				t.Fatalf("header % x, want length 16, code %d, unique 0", h, notifyIncEpoch)
			}
		}
		return n / 16
	}
	k := newKernelNames(p[1], 44)
	if k == nil {
		t.Fatal("no name cache")
	}
	if n := epochs(); n != 1 {
		t.Fatalf("%d epochs at start, want the probe's 1", n)
	}
	dir, other := oid.Make(1, 2), oid.Make(1, 3)
	if !k.changed([]oid.ID{dir}) || epochs() != 0 {
		t.Fatal("an epoch for a directory whose names the kernel does not hold")
	}
	k.hold(dir, time.Now())
	if !k.changed([]oid.ID{other}) || epochs() != 0 {
		t.Fatal("an epoch for another directory")
	}
	if !k.changed([]oid.ID{other, dir}) || epochs() != 1 {
		t.Fatal("no epoch for a directory whose names the kernel may hold")
	}
	if !k.changed([]oid.ID{dir}) || epochs() != 0 {
		t.Fatal("the epoch took every name back, yet another followed")
	}
	k.hold(dir, time.Now().Add(-maxEntryTimeout-replySlack-time.Second))
	if !k.changed([]oid.ID{dir}) || epochs() != 0 {
		t.Fatal("an epoch for names that expired in the kernel")
	}
	k.hold(dir, time.Now())
	k.close()
	if !k.changed([]oid.ID{dir}) || epochs() != 0 {
		t.Fatal("an epoch after the mount ended")
	}
}
