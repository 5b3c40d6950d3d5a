package configsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/serf/coordinate"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// NodeCoord is a node's network coordinate as published in the
// configuration service (`wheelfs status` shows them). Every node that
// keeps a coordinate publishes one, clients too, under coords/<id>
// attached to a lease of its own: not under servers/, whose changes wake
// every watcher of the slice table, while coordinates change all the
// time.
type NodeCoord struct {
	ID     string                 `json:"id"`
	Site   string                 `json:"site"`
	Server bool                   `json:"server,omitempty"`
	Coord  *coordinate.Coordinate `json:"coord"`
	// Samples is how many round-trip samples the coordinate is made of.
	Samples uint64 `json:"samples"`
}

func (s *EtcdService) coordsPfx() string {
	return strings.TrimSuffix(s.serversPfx, "servers/") + "coords/"
}

// A coordinate is written again only when it moved at least
// coordMoved from the one written last, or that one is older than
// coordRewrite; otherwise a publication only renews its lease. Every write
// is a raft proposal that each member logs: 250 hosts writing every 30 s
// made eight a second, for a figure `wheelfs status` shows rounded to the
// millisecond.
const (
	coordMoved   = 2 * time.Millisecond
	coordRewrite = 10 * time.Minute
)

// publishedCoord is what PublishCoord wrote last for a node.
type publishedCoord struct {
	lease clientv3.LeaseID
	coord *coordinate.Coordinate
	at    time.Time
}

// unmoved reports whether c need not be written again over p.
func (p publishedCoord) unmoved(c NodeCoord) bool {
	if p.coord == nil || c.Coord == nil || time.Since(p.at) >= coordRewrite || !p.coord.IsCompatibleWith(c.Coord) {
		return false
	}
	return p.coord.DistanceTo(c.Coord) < coordMoved
}

// PublishCoord writes c under a lease of ttl, renewed by the next publish:
// a node that stops publishing disappears after ttl; Close withdraws it. A
// coordinate that has not moved since the last write only renews the
// lease.
func (s *EtcdService) PublishCoord(ctx context.Context, c NodeCoord, ttl time.Duration) error {
	if c.ID == "" {
		return errors.New("configsvc: publish coordinate: empty node ID")
	}
	val, err := json.Marshal(c)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	last := s.coords[c.ID]
	s.mu.Unlock()
	lease := last.lease
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	if lease != clientv3.NoLease {
		resp, err := s.cli.KeepAliveOnce(cctx, lease)
		switch {
		case err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound):
			return fmt.Errorf("configsvc: renew coordinate of %s: %w", c.ID, err)
		case err != nil || resp.TTL <= 0:
			lease = clientv3.NoLease
		case last.unmoved(c):
			return nil // the key lives on with its lease
		}
	}
	if lease == clientv3.NoLease {
		g, err := s.cli.Grant(cctx, ttlSeconds(ttl))
		if err != nil {
			return fmt.Errorf("configsvc: publish coordinate of %s: %w", c.ID, err)
		}
		lease = g.ID
	}
	s.mu.Lock()
	if s.coords == nil {
		s.coords = map[string]publishedCoord{}
	}
	s.coords[c.ID] = publishedCoord{lease: lease} // written below, or not: write next time
	s.mu.Unlock()
	if _, err := s.cli.Put(cctx, s.coordsPfx()+c.ID, string(val), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("configsvc: publish coordinate of %s: %w", c.ID, err)
	}
	s.mu.Lock()
	if s.coords != nil { // not withdrawn meanwhile
		p := publishedCoord{lease: lease, at: time.Now()}
		if c.Coord != nil {
			p.coord = c.Coord.Clone()
		}
		s.coords[c.ID] = p
	}
	s.mu.Unlock()
	return nil
}

// Coords returns every published coordinate, by node ID.
func (s *EtcdService) Coords(ctx context.Context) (map[string]NodeCoord, error) {
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	pfx := s.coordsPfx()
	resp, err := s.cli.Get(cctx, pfx, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("configsvc: read coordinates: %w", err)
	}
	out := make(map[string]NodeCoord, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var c NodeCoord
		if err := json.Unmarshal(kv.Value, &c); err != nil || c.Coord == nil || !c.Coord.IsValid() {
			continue
		}
		out[strings.TrimPrefix(string(kv.Key), pfx)] = c
	}
	return out, nil
}

// withdrawCoords revokes the leases of published coordinates (not after
// Abandon: a crashed node's coordinate expires).
func (s *EtcdService) withdrawCoords() {
	s.mu.Lock()
	published := s.coords
	s.coords = nil
	s.mu.Unlock()
	for _, p := range published {
		s.revoke(p.lease)
	}
}

// PublishCoord implements EtcdService.PublishCoord for Memory clients.
func (c *memClient) PublishCoord(ctx context.Context, nc NodeCoord, ttl time.Duration) error {
	if c.closed() {
		return ErrClosed
	}
	if nc.ID == "" {
		return errors.New("configsvc: publish coordinate: empty node ID")
	}
	c.sp.mu.Lock()
	defer c.sp.mu.Unlock()
	if c.sp.coords == nil {
		c.sp.coords = map[string]memCoord{}
	}
	c.sp.coords[nc.ID] = memCoord{c: nc, expires: time.Now().Add(ttl)}
	if c.published == nil {
		c.published = map[string]bool{}
	}
	c.published[nc.ID] = true
	return nil
}

// Coords implements EtcdService.Coords for Memory clients.
func (c *memClient) Coords(ctx context.Context) (map[string]NodeCoord, error) {
	if c.closed() {
		return nil, ErrClosed
	}
	c.sp.mu.Lock()
	defer c.sp.mu.Unlock()
	now := time.Now()
	out := map[string]NodeCoord{}
	for id, mc := range c.sp.coords {
		if now.After(mc.expires) {
			delete(c.sp.coords, id)
			continue
		}
		out[id] = mc.c
	}
	return out, nil
}

type memCoord struct {
	c       NodeCoord
	expires time.Time
}
