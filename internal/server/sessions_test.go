package server_test

import (
	"context"
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/poll"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestSessionBoundToNode: a client session (its lease back channel, its
// leases, its open handles) is its node's. Another node that names it —
// having guessed or learnt the number — cannot attach to its Callbacks
// stream, take its leases, write through or release its handles; the
// owner's stream keeps receiving its revocations.
func TestSessionBoundToNode(t *testing.T) {
	// Uids are trusted: the sessions here are client cores', not logins.
	r := startRig(t, func(c *deploy.Config) { c.TrustClientUIDs = true })
	a := wire.NewStorageClient(r.dial(t, "cli-owner"))
	b := wire.NewStorageClient(r.dial(t, "cli-thief"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const sess = 0x5e55_1011
	handle := &wire.HandleRef{Session: sess, Id: 1}
	owner := &wire.Caller{Session: sess, Handle: handle}

	// The owner opens its back channel and creates a file open for writing.
	cb, err := a.Callbacks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := cb.Send(&wire.CallbackAck{Session: sess}); err != nil {
		t.Fatal(err)
	}
	cr, err := a.Create(ctx, &wire.CreateRequest{Caller: owner, Dir: uint64(oid.Root), Name: "f",
		Type: wire.Type_TYPE_FILE, Mode: 0o644, OpenAccess: 6, Op: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !cr.Opened {
		t.Fatal("create did not open the file")
	}
	f := cr.Meta.Id
	// A lease through the owner's stream (granted once it attached).
	poll.Until(t, 10*time.Second, "a lease for the owner", func() error {
		g, err := a.GetAttr(ctx, &wire.GetAttrRequest{Caller: &wire.Caller{Session: sess}, Id: f})
		if err != nil {
			return err
		}
		if g.LeaseMs == 0 {
			return errors.New("no lease yet")
		}
		return nil
	})

	// The thief's stream for the owner's session is refused.
	tcb, err := b.Callbacks(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tcb.Send(&wire.CallbackAck{Session: sess}); err != nil {
		t.Fatal(err)
	}
	if _, err := tcb.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("thief's Callbacks stream for the owner's session: %v, want PermissionDenied", err)
	}

	eperm := func(what string, err error) {
		t.Helper()
		if fserr.Errno(fserr.FromStatus(err)) != syscall.EPERM {
			t.Errorf("%s: %v, want EPERM", what, err)
		}
	}
	thief := &wire.Caller{Session: 0x7e1ef}
	_, err = b.GetAttr(ctx, &wire.GetAttrRequest{Caller: &wire.Caller{Session: sess}, Id: f})
	eperm("getattr with the owner's session (a lease on its stream)", err)
	_, err = b.SetAttr(ctx, &wire.SetAttrRequest{Caller: &wire.Caller{Session: thief.Session, Handle: handle},
		Id: f, Valid: wire.SetSize, Size: 1, ViaHandle: true})
	eperm("ftruncate through the owner's handle", err)
	_, err = b.Release(ctx, &wire.ReleaseRequest{Id: f, Handle: handle})
	eperm("release of the owner's handle", err)
	_, err = b.Release(ctx, &wire.ReleaseRequest{Id: f})
	eperm("release without a handle", err)

	// The owner's stream, which the refused attach did not displace,
	// still hears the revocations of its leases (acknowledged here).
	revoked := make(chan []uint64, 16)
	go func() {
		for {
			rv, err := cb.Recv()
			if err != nil {
				close(revoked)
				return
			}
			revoked <- rv.Ids
			if cb.Send(&wire.CallbackAck{Session: sess, Seq: rv.Seq}) != nil {
				return
			}
		}
	}()
	// The owner unlinks its open file: it lives on (its handle is still
	// counted, the thief's releases did nothing) until the owner releases.
	if _, err := a.Remove(ctx, &wire.RemoveRequest{Caller: owner, Dir: uint64(oid.Root), Name: "f"}); err != nil {
		t.Fatal(err)
	}
	select {
	case ids := <-revoked:
		if !slices.Contains(ids, f) {
			t.Fatalf("revoked %v, want %v among them", ids, f)
		}
	case <-ctx.Done():
		t.Fatal("no revocation reached the owner's stream")
	}
	if _, err := a.GetAttr(ctx, &wire.GetAttrRequest{Caller: &wire.Caller{}, Id: f}); err != nil {
		t.Fatalf("getattr of the open unlinked file: %v", err)
	}
	if _, err := a.Release(ctx, &wire.ReleaseRequest{Id: f, Handle: handle}); err != nil {
		t.Fatalf("owner's release: %v", err)
	}
	_, err = a.GetAttr(ctx, &wire.GetAttrRequest{Caller: &wire.Caller{}, Id: f})
	if fserr.Errno(fserr.FromStatus(err)) != syscall.ENOENT {
		t.Fatalf("getattr after the last release of an unlinked file: %v, want ENOENT", err)
	}
}

// TestForwardedOpenBindsSession: the object half of a two-step create
// (Peer.CreateObject) binds the open's session to the client's node, as
// the directory's primary saw it, so another node cannot use that open
// at the object's primary either; a second forwarded create for the
// session from another node is refused.
func TestForwardedOpenBindsSession(t *testing.T) {
	r := startRig(t, func(c *deploy.Config) { c.TrustClientUIDs = true })
	peer := wire.NewPeerClient(r.dial(t, r.h.ServerID())) // as a registered server
	a := wire.NewStorageClient(r.dial(t, "cli-owner"))
	b := wire.NewStorageClient(r.dial(t, "cli-thief"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const sess = 0xf0_4a4d
	handle := &wire.HandleRef{Session: sess, Id: 1}
	meta := &wire.Meta{Type: wire.Type_TYPE_FILE, Mode: 0o644, Nlink: 1}
	cr, err := peer.CreateObject(ctx, &wire.CreateObjectRequest{Meta: meta, Handle: handle, OpenAccess: 6, ClientNode: "cli-owner"})
	if err != nil {
		t.Fatal(err)
	}
	f := cr.Meta.Id
	_, err = b.SetAttr(ctx, &wire.SetAttrRequest{Caller: &wire.Caller{Handle: handle}, Id: f, Valid: wire.SetSize, Size: 1, ViaHandle: true})
	if fserr.Errno(fserr.FromStatus(err)) != syscall.EPERM {
		t.Fatalf("ftruncate through the forwarded open by another node: %v, want EPERM", err)
	}
	if _, err := a.SetAttr(ctx, &wire.SetAttrRequest{Caller: &wire.Caller{Handle: handle}, Id: f, Valid: wire.SetSize, Size: 1, ViaHandle: true}); err != nil {
		t.Fatalf("ftruncate through its own forwarded open: %v", err)
	}
	_, err = peer.CreateObject(ctx, &wire.CreateObjectRequest{Meta: meta, Handle: &wire.HandleRef{Session: sess, Id: 2}, OpenAccess: 6, ClientNode: "cli-thief"})
	if fserr.Errno(fserr.FromStatus(err)) != syscall.EPERM {
		t.Fatalf("forwarded create for the owner's session from another node: %v, want EPERM", err)
	}
}
