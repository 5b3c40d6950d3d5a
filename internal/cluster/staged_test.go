package cluster

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/oid"
)

// TestCommitAfterPrimaryRestart: a client writes a file past DirtyBytes,
// so its full blocks are uploaded ahead of the close, and the file's
// primary restarts, or dies and a backup takes over, before the close. A
// primary keeps uploaded blocks in memory until a commit names them, so
// the primary at the close has lost them: the close used to fail with
// EIO and the data was gone. Now the client sends them again from its
// block cache and the close succeeds.
func TestCommitAfterPrimaryRestart(t *testing.T) {
	c := Start(t, Options{Sites: []string{"west", "east", "eu"}, LockTTL: 2 * time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	fs := c.Client("east")
	data := make([]byte, 6<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	const first = 5 << 20
	for _, tc := range []struct {
		name, path string
		fault      func(p *Node, id oid.ID) *Node // returns the primary at the close
	}{
		{"restart", "/.Site=west/.RepLevel=1/restarted", func(p *Node, _ oid.ID) *Node {
			c.Crash(p)
			c.Restart(p)
			return p
		}},
		{"failover", "/.Site=west/.RepLevel=2/failed-over", func(_ *Node, id oid.ID) *Node {
			crashPrimary(t, ctx, c, id)
			n, err := c.Primary(ctx, id.Slice())
			if err != nil {
				t.Fatal(err)
			}
			return n
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Created and closed first: a create whose replication is
			// not known at the failover fails the close on its own.
			if err := fs.WriteFile(ctx, Owner(), tc.path, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			r := resolve(t, ctx, fs, Owner(), tc.path)
			h, _, err := fs.Open(ctx, Owner(), r.Cues, oid.ID(r.Meta.Id), syscall.O_RDWR)
			if err != nil {
				t.Fatal(err)
			}
			p, err := c.PrimaryOf(ctx, fs, tc.path)
			if err != nil || p.Site != "west" {
				t.Fatalf("primary of %s: %v (%v), want west's server", tc.path, p, err)
			}
			if _, err := h.Write(ctx, data[:first], 0); err != nil {
				t.Fatal(err)
			}
			c.WaitFor(30*time.Second, "the blocks past DirtyBytes uploaded, pending at the primary", func() error {
				u, err := srv(t, p).StoreUsage()
				if err != nil || u.PendingBlocks < 64 {
					return fmt.Errorf("pending blocks %d (%v)", u.PendingBlocks, err)
				}
				return nil
			})
			now := tc.fault(p, h.ID())
			if u, err := srv(t, now).StoreUsage(); err != nil || u.PendingBlocks != 0 {
				t.Fatalf("the primary at the close holds %d pending blocks (%v); the test needs them lost", u.PendingBlocks, err)
			}
			if _, err := h.Write(ctx, data[first:], first); err != nil {
				t.Fatal(err)
			}
			if err := h.Flush(ctx); err != nil {
				t.Fatalf("close: %v", err)
			}
			h.Release(ctx)
			got, err := c.Client("west").ReadFile(ctx, Owner(), tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes, not the %d written", len(got), len(data))
			}
		})
	}
}
