package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/poll"
)

// TestRevokedNodes (issue 13, node revocation): a revoked client host's
// requests are refused within seconds, over connections it already had,
// while other clients go on; a revoked server leaves the registrations,
// its replica is replaced as if it had died, and the data stays readable.
func TestRevokedNodes(t *testing.T) {
	c := Start(t, Options{})
	ctx := opCtx(t)
	deny := c.Conf.(configsvc.Denials)
	west, east := c.Client("west"), c.Client("east")
	data := []byte("kept through a revocation")
	if err := west.WriteFile(ctx, Owner(), "/.RepLevel=2/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readIs(ctx, east, "/f", data); err != nil {
		t.Fatal(err) // east has live connections to the servers now
	}

	// The client host of east.
	if err := deny.Deny(ctx, configsvc.Denial{Name: c.ClientNode("east").ID(), Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	poll.Until(t, 5*time.Second, "east's client refused", func() error {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := east.ReadFile(rctx, Owner(), "/f"); err == nil {
			return errors.New("east still reads")
		}
		return nil
	})
	t.Logf("revoked client refused after %v", time.Since(start).Round(time.Millisecond))
	if err := readIs(ctx, west, "/f", data); err != nil {
		t.Fatalf("west after east's revocation: %v", err)
	}

	// A backup of /f's slice.
	r, err := west.Resolve(ctx, Owner(), "/f")
	if err != nil {
		t.Fatal(err)
	}
	sl := oid.ID(r.Meta.Id).Slice()
	replicas := func() ([]string, error) {
		tb, err := c.Conf.Table(ctx)
		if err != nil {
			return nil, err
		}
		return tb.Slices[sl].Replicas, nil
	}
	var before []string
	poll.Until(t, 10*time.Second, "two replicas", func() error {
		before, err = replicas()
		if err == nil && len(before) != 2 {
			err = fmt.Errorf("replicas %v", before)
		}
		return err
	})
	victim := before[1]
	if err := c.Deny(ctx, victim, "test"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "a new replica in place of the revoked server", func() error {
		now, err := replicas()
		switch {
		case err != nil:
			return err
		case slices.Contains(now, victim) || len(now) != 2:
			return fmt.Errorf("replicas %v (revoked %s)", now, victim)
		}
		return nil
	})
	tb, err := c.Conf.Table(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tb.Servers[victim]; ok {
		t.Fatalf("revoked server %s still registered", victim)
	}
	if err := readIs(ctx, west, "/f", data); err != nil {
		t.Fatalf("read after the server's revocation: %v", err)
	}

	// Now the primary: its lock goes with the revocation, so the one
	// backup left takes the slice over. No server is left to replace it,
	// so it stays listed, as a dead one would (keepFloor).
	var primary, backup string
	poll.Until(t, 10*time.Second, "a primary holding the lock", func() error {
		tb, err := c.Conf.Table(ctx)
		if err != nil {
			return err
		}
		s := tb.Slices[sl]
		if len(s.Replicas) != 2 || s.Holder != s.Replicas[0] {
			return fmt.Errorf("slice %+v", s)
		}
		primary, backup = s.Replicas[0], s.Replicas[1]
		return nil
	})
	if err := c.Deny(ctx, primary, "test"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "the backup holds the slice", func() error {
		tb, err := c.Conf.Table(ctx)
		if err != nil {
			return err
		}
		if s := tb.Slices[sl]; s.Holder != backup || len(s.Replicas) == 0 || s.Replicas[0] != backup {
			return fmt.Errorf("slice %+v (revoked primary %s)", s, primary)
		}
		return nil
	})
	if err := readIs(ctx, west, "/f", data); err != nil {
		t.Fatalf("read after the primary's revocation: %v", err)
	}
}

// TestRevokedNodeShutOutOfConfig (issue 13): in a new deployment the
// configuration service's authentication is on by default (the first
// server, which holds the CA key, turns it on), and a revoked node is
// refused by etcd itself (its etcd user is deleted by the hosts holding
// the CA key, which follow the deny list): its etcd client can neither
// read the tables nor take itself off the deny list. Other nodes go on.
func TestRevokedNodeShutOutOfConfig(t *testing.T) {
	c := Start(t, Options{DefaultConfigAuth: true})
	ctx := opCtx(t)
	if on, err := c.Conf.(*configsvc.EtcdService).AuthEnabled(ctx); err != nil || !on {
		t.Fatalf("configuration service authentication in a new deployment: on=%v, %v", on, err)
	}
	west, east := c.Client("west"), c.Client("east")
	data := []byte("written with etcd auth on")
	if err := west.WriteFile(ctx, Owner(), "/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := readIs(ctx, east, "/f", data); err != nil {
		t.Fatal(err)
	}
	node := c.ClientNode("east")
	conf := node.Host().Conf
	if _, err := conf.Table(ctx); err != nil {
		t.Fatalf("east's etcd client before the revocation: %v", err)
	}

	if err := c.Conf.(configsvc.Denials).Deny(ctx, configsvc.Denial{Name: node.ID(), Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	poll.Until(t, 10*time.Second, "east refused by etcd", func() error {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := conf.Table(rctx); err == nil {
			return errors.New("east still reads the tables")
		}
		return nil
	})
	t.Logf("revoked node refused by etcd after %v", time.Since(start).Round(time.Millisecond))
	_, err := conf.Table(ctx)
	if !strings.Contains(fmt.Sprint(err), "permission denied") && !strings.Contains(fmt.Sprint(err), "user name not found") {
		t.Fatalf("east's read: %v, want etcd's refusal", err)
	}
	if err := conf.(configsvc.Denials).Undeny(ctx, node.ID()); err == nil {
		t.Fatal("the revoked node took itself off the deny list")
	}
	var denied bool
	wctx, stop := context.WithCancel(ctx)
	for _, d := range <-c.Conf.(configsvc.Denials).WatchDenied(wctx) {
		denied = denied || d.Name == node.ID()
	}
	stop()
	if !denied {
		t.Fatal("the deny entry is gone")
	}
	if _, err := c.Conf.Table(ctx); err != nil {
		t.Fatalf("another node's etcd client: %v", err)
	}
	if err := readIs(ctx, west, "/f", data); err != nil {
		t.Fatalf("west after east's revocation: %v", err)
	}

	// A client host that is not revoked only reads the tables and
	// publishes its coordinate: it can neither lift a revocation nor
	// write itself a login.
	wconf := c.ClientNode("west").Host().Conf.(*configsvc.EtcdService)
	if _, err := wconf.Table(ctx); err != nil {
		t.Fatalf("west's etcd client reads: %v", err)
	}
	if err := wconf.PublishCoord(ctx, configsvc.NodeCoord{ID: c.ClientNode("west").ID(), Site: "west"}, time.Minute); err != nil {
		t.Fatalf("west publishes its coordinate: %v", err)
	}
	if err := wconf.Undeny(ctx, node.ID()); err == nil {
		t.Fatal("a client host took a node off the deny list")
	}
	login := configsvc.Login{Node: c.ClientNode("west").ID(), UID: 1000, User: "alice", Key: "SHA256:x", Expires: time.Now().Add(time.Hour)}
	if err := wconf.PutLogin(ctx, login); err == nil {
		t.Fatal("a client host wrote itself a login")
	}
}
