package cluster

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/netcoord"
)

// TestNearReplicaServesPlainReads (issue 12 item 5): a read without cues
// at eu of a file whose primary is at west takes every block from the
// replica at eu (the primary lists the blocks with a grant), and none
// from west; a user who may not read the file gets nothing from the
// replica; with the replica at eu stopped, the read still succeeds, from
// the primary.
func TestNearReplicaServesPlainReads(t *testing.T) {
	c := Start(t, Options{RTT: MatrixRTT(hotspotRTT)})
	ctx := t.Context()
	writer := c.Servers("west")[0]
	data := make([]byte, 6*client.BlockSize+100)
	rand.Read(data)
	if err := writer.Client().WriteFile(ctx, Owner(), "/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := c.PrimaryOf(ctx, writer.Client(), "/f"); err != nil || p != writer {
		t.Fatalf("primary of /f: %v %v, want %v (write-local)", p, err, writer)
	}
	west, eu := writer.Host().Server, c.Servers("eu")[0].Host().Server
	sentWest, sentEU := west.BlockBytesSent(), eu.BlockBytesSent()
	got, err := c.Client("eu").ReadFile(ctx, Owner(), "/f")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read at eu: %v (%d bytes)", err, len(got))
	}
	if d := west.BlockBytesSent() - sentWest; d != 0 {
		t.Errorf("the primary at west sent %d block bytes, want 0", d)
	}
	if d := eu.BlockBytesSent() - sentEU; d != int64(len(data)) {
		t.Errorf("the replica at eu sent %d block bytes, want %d", d, len(data))
	}

	// A user who may not read /g gets no grant, hence nothing from eu.
	rand.Read(data)
	if err := writer.Client().WriteFile(ctx, Owner(), "/g", data, 0o600); err != nil {
		t.Fatal(err)
	}
	sentEU = eu.BlockBytesSent()
	stranger := client.User{Uid: 4242, Gid: 4242}
	if _, err := c.Client("east").ReadFile(ctx, stranger, "/g"); !errors.Is(err, fserr.ErrAccess) && !errors.Is(err, fserr.ErrPerm) {
		t.Fatalf("stranger reads /g: %v, want a permission error", err)
	}
	if d := eu.BlockBytesSent() - sentEU; d != 0 {
		t.Errorf("the replica at eu sent %d block bytes of /g to a stranger", d)
	}

	// Without the replica at eu, the primary serves.
	rand.Read(data)
	if err := writer.Client().WriteFile(ctx, Owner(), "/h", data, 0o644); err != nil {
		t.Fatal(err)
	}
	c.Stop(c.Servers("eu")[0])
	reader := c.Client("eu")
	sentWest = west.BlockBytesSent()
	got, err = reader.ReadFile(ctx, Owner(), "/h")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read at eu with its replica stopped: %v (%d bytes)", err, len(got))
	}
	if d := west.BlockBytesSent() - sentWest; d != int64(len(data)) {
		t.Errorf("the primary sent %d block bytes with the replica at eu stopped, want %d", d, len(data))
	}
}

// TestNearReplicaElsewhere: with no replica at the reader's site, a plain
// read takes the blocks from a replica at another site that the reader's
// network coordinates put clearly nearer than the primary: the primary is
// at eu, its one backup at west or east, and the reader at the other of
// the two, 40 ms from the backup and 80 or 120 ms from the primary.
func TestNearReplicaElsewhere(t *testing.T) {
	c := Start(t, Options{RTT: MatrixRTT(hotspotRTT), Adjust: fastCoords})
	ctx := t.Context()
	writer := c.Servers("eu")[0]
	data := make([]byte, 5*client.BlockSize)
	rand.Read(data)
	if err := writer.Client().WriteFile(ctx, Owner(), "/.RepLevel=2/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	in, err := info(ctx, writer.Client(), "/f")
	if err != nil {
		t.Fatal(err)
	}
	if in.Primary.Server != writer.ID() || len(in.Replicas) != 2 {
		t.Fatalf("/f: primary %v, replicas %v; want %v and one backup", in.Primary, in.Replicas, writer)
	}
	backup := in.Replicas[0]
	if backup.Server == writer.ID() {
		backup = in.Replicas[1]
	}
	site := map[string]string{"west": "east", "east": "west"}[backup.Site]
	if site == "" {
		t.Fatalf("backup at %s, want west or east", backup.Site)
	}
	reader := c.ClientNode(site)
	coord := reader.Host().Coord
	c.WaitFor(30*time.Second, "the reader's coordinates put the backup clearly nearer than the primary", func() error {
		p, b := coord.EstimateTo(writer.ID()), coord.EstimateTo(backup.Server)
		if p == netcoord.Unknown || b == netcoord.Unknown || float64(b) >= 0.7*float64(p) {
			return fmt.Errorf("estimated RTT to the primary %v, to the backup %v", p, b)
		}
		return nil
	})
	primary, near := writer.Host().Server, c.Node(backup.Server).Host().Server
	sentP, sentB := primary.BlockBytesSent(), near.BlockBytesSent()
	got, err := reader.Client().ReadFile(ctx, Owner(), "/f")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read at %s: %v (%d bytes)", site, err, len(got))
	}
	if d := primary.BlockBytesSent() - sentP; d != 0 {
		t.Errorf("the primary sent %d block bytes, want 0", d)
	}
	if d := near.BlockBytesSent() - sentB; d != int64(len(data)) {
		t.Errorf("the backup at %s sent %d block bytes, want %d", backup.Site, d, len(data))
	}
}
