package deploy

import (
	"context"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/every"
)

// CoordConfig tunes a host's network coordinate (netcoord): how often it
// samples, probes and publishes.
type CoordConfig struct {
	// SampleEvery is the least time between two samples of one server
	// (default netcoord.DefaultSampleEvery).
	SampleEvery time.Duration
	// ProbeEvery is how often an otherwise unsampled server is probed
	// (default route.DefaultProbeEvery; negative: never).
	ProbeEvery time.Duration
	// PublishEvery is how often the coordinate is written to the
	// configuration service (default DefaultPublishEvery); it lasts three
	// periods there unless published again.
	PublishEvery time.Duration
}

// DefaultPublishEvery is how often a host publishes its coordinate: one
// small etcd write per host every 30 s.
const DefaultPublishEvery = 30 * time.Second

// publishTimeout bounds one publication.
const publishTimeout = 5 * time.Second

// publishCoord starts publishing the host's coordinate (for `wheelfs
// status`) until the host stops. Nothing is published before the first
// sample: the origin says nothing.
func (h *Host) publishCoord(ctx context.Context) {
	period := h.cfg.Coord.PublishEvery
	if period <= 0 {
		period = DefaultPublishEvery
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	stop := func() error { cancel(); <-done; return nil }
	h.onClose(stop, stop)
	publish := func() {
		applied, _ := h.Coord.Samples()
		if applied == 0 {
			return
		}
		nc := configsvc.NodeCoord{ID: h.id.Server, Site: h.cfg.Site, Server: h.cfg.Roles&RoleServer != 0,
			Coord: h.Coord.Coordinate(), Samples: applied}
		pctx, pcancel := context.WithTimeout(ctx, publishTimeout)
		defer pcancel()
		if err := h.etcd.PublishCoord(pctx, nc, 3*period); err != nil && ctx.Err() == nil {
			h.log.Debug("publish coordinate failed", "err", err)
		}
	}
	go func() {
		defer close(done)
		every.Do(ctx, period, nil, publish)
	}()
}
