package client_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/deploy/deploytest"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

var root = client.User{}

// TestFileContentsMatchModel drives random writes, truncates, reads,
// flushes and reopens against an in-memory model of the file. A small
// dirty limit forces uploads of blocks ahead of the commit.
func TestFileContentsMatchModel(t *testing.T) {
	h := deploytest.Start(t, func(c *deploy.Config) { c.Client.DirtyBytes = 3 * client.BlockSize })
	fs := h.Client
	ctx := context.Background()
	for seed := uint64(1); seed <= 4; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		m, err := fs.Create(ctx, root, client.NoCues, oid.Root, "model"+string(rune('0'+seed)),
			client.CreateArgs{Type: wire.Type_TYPE_FILE, Mode: 0o644})
		if err != nil {
			t.Fatal(err)
		}
		id := oid.ID(m.Id)
		var model []byte
		fh, _, err := fs.Open(ctx, root, client.NoCues, id, syscall.O_RDWR)
		if err != nil {
			t.Fatal(err)
		}
		for step := 0; step < 300; step++ {
			switch op := rng.IntN(10); {
			case op < 5: // write somewhere, often across block boundaries, sometimes past EOF
				off := rng.IntN(6 * client.BlockSize)
				n := 1 + rng.IntN(2*client.BlockSize)
				data := make([]byte, n)
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				if _, err := fh.Write(ctx, data, int64(off)); err != nil {
					t.Fatal(err)
				}
				if off+n > len(model) {
					model = append(model, make([]byte, off+n-len(model))...)
				}
				copy(model[off:], data)
			case op < 7: // read a random range
				off := rng.IntN(len(model) + 10)
				n := rng.IntN(3 * client.BlockSize)
				buf := make([]byte, n)
				got, err := fh.Read(ctx, buf, int64(off))
				if err != nil {
					t.Fatal(err)
				}
				want := []byte{}
				if off < len(model) {
					want = model[off:min(len(model), off+n)]
				}
				if !bytes.Equal(buf[:got], want) {
					t.Fatalf("seed %d step %d: read %d@%d mismatch (got %d bytes, want %d)", seed, step, n, off, got, len(want))
				}
			case op < 8: // truncate (shrink or grow)
				size := rng.IntN(5 * client.BlockSize)
				if _, err := fs.SetAttr(ctx, root, client.NoCues, id, &wire.SetAttrRequest{Valid: wire.SetSize, Size: uint64(size), ViaHandle: true}); err != nil {
					t.Fatal(err)
				}
				if size < len(model) {
					model = model[:size]
				} else {
					model = append(model, make([]byte, size-len(model))...)
				}
			case op < 9: // close and reopen: close-to-open must show everything
				if err := fh.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				fh.Release(ctx)
				if fh, _, err = fs.Open(ctx, root, client.NoCues, id, syscall.O_RDWR); err != nil {
					t.Fatal(err)
				}
			default:
				if err := fh.Fsync(ctx); err != nil {
					t.Fatal(err)
				}
			}
			a, err := fs.GetAttr(ctx, root, client.NoCues, id)
			if err != nil {
				t.Fatalf("seed %d step %d: getattr: %v", seed, step, err)
			}
			if a.Size != uint64(len(model)) {
				t.Fatalf("seed %d step %d: size %d, model %d", seed, step, a.Size, len(model))
			}
		}
		if err := fh.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		fh.Release(ctx)
		got, err := fs.ReadFile(ctx, root, "/model"+string(rune('0'+seed)))
		if err != nil || !bytes.Equal(got, model) {
			t.Fatalf("seed %d: final contents differ (%d vs %d bytes, err %v)", seed, len(got), len(model), err)
		}
	}
}

// TestUnlinkedOpenFileStaysReadable checks POSIX unlink-while-open.
func TestUnlinkedOpenFileStaysReadable(t *testing.T) {
	h := deploytest.Start(t, nil)
	fs := h.Client
	ctx := context.Background()
	if err := fs.WriteFile(ctx, root, "/tmpfile", []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, _ := fs.Resolve(ctx, root, "/tmpfile")
	fh, _, err := fs.Open(ctx, root, client.NoCues, oid.ID(r.Meta.Id), syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Remove(ctx, root, client.NoCues, oid.Root, "tmpfile", false); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := fh.Read(ctx, buf, 0)
	if err != nil || string(buf[:n]) != "still here" {
		t.Fatalf("read after unlink: %q, %v", buf[:n], err)
	}
	fh.Release(ctx)
	// The release reaches the primary in the background.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := fs.GetAttr(ctx, root, client.NoCues, oid.ID(r.Meta.Id)); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("orphan still exists 10 s after the last release")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// silentStorage is a server that takes every Lookup and never answers;
// like gRPC, the call ends only when the caller's context does.
type silentStorage struct {
	wire.StorageClient
	lookups atomic.Int32
}

func (s *silentStorage) Lookup(ctx context.Context, _ *wire.LookupRequest, _ ...grpc.CallOption) (*wire.LookupResponse, error) {
	s.lookups.Add(1)
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// Probe is silent too: the server is away, not busy.
func (s *silentStorage) Probe(ctx context.Context, _ *wire.ProbeRequest, _ ...grpc.CallOption) (*wire.ProbeResponse, error) {
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// oneServer routes every slice to one server.
type oneServer struct {
	client.Router // only Primary is used
	conn          client.Conn
}

func (r oneServer) Primary(context.Context, oid.Slice) (client.Conn, error) { return r.conn, nil }

// TestMaxTimeBoundsOperations checks that a .MaxTime cue, not the default
// time limit, ends an operation on a server that does not answer.
func TestMaxTimeBoundsOperations(t *testing.T) {
	srv := &silentStorage{}
	fs := client.New(client.Config{Timeout: time.Minute, NoLeases: true},
		oneServer{conn: client.Conn{ID: "silent", StorageClient: srv}})
	defer fs.Close()
	comps, cues, err := fs.ParseCues("/.MaxTime=200/x")
	if err != nil || len(comps) != 1 || cues.MaxTime != 200*time.Millisecond {
		t.Fatalf("parse: %v %v %v", comps, cues, err)
	}
	const margin = 500 * time.Millisecond
	start := time.Now()
	_, err = fs.Lookup(context.Background(), root, cues, oid.Root, "x")
	took := time.Since(start)
	if fserr.Errno(err) != syscall.ETIMEDOUT {
		t.Fatalf("lookup on a silent server: %v, want ETIMEDOUT", err)
	}
	if srv.lookups.Load() == 0 {
		t.Fatal("the lookup never reached the server")
	}
	if took < cues.MaxTime || took > cues.MaxTime+margin {
		t.Fatalf("lookup returned after %v, want %v (+%v)", took, cues.MaxTime, margin)
	}
}
