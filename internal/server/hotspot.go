package server

import (
	"context"
	"errors"
	"time"

	"github.com/wheelfs/wheelfs/internal/blockgrant"
	"github.com/wheelfs/wheelfs/internal/holders"
	"github.com/wheelfs/wheelfs/internal/netcoord"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/pki"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Holder lists: how many holders one answer names at most, and how many
// per block are enough (more only add fallbacks a reader never reaches).
const (
	defaultMaxHolders = 8
	holdersPerBlock   = 4
)

// Probe implements wire.StorageServer: an empty call whose round trip the
// caller's network coordinate samples (netcoord).
func (s *Server) Probe(context.Context, *wire.ProbeRequest) (*wire.ProbeResponse, error) {
	return &wire.ProbeResponse{}, nil
}

// ReportHolding implements wire.StorageServer: it records what the client
// caches of files this server is primary for. Entries for other files,
// other versions than the current one, or files the reporting user may not
// read are skipped: the report is soft state and a hint.
func (s *Server) ReportHolding(ctx context.Context, req *wire.ReportHoldingRequest) (*wire.ReportHoldingResponse, error) {
	node := req.Node
	if name, err := pki.PeerName(ctx); err == nil {
		node = name // authenticated: a client cannot report for another
	}
	if node == "" {
		return &wire.ReportHoldingResponse{}, nil
	}
	h := holders.Holder{Node: node, Site: req.Site, Coord: netcoord.FromWire(req.Coord), Addr: req.PeerAddr}
	now := time.Now()
	for _, held := range req.Held {
		id := oid.ID(held.Id)
		s.origin.Held(now, held.Id, node, ranges(held.Blocks))
		if !s.readable(ctx, held.Caller, id, held.Version) {
			continue
		}
		s.holders.Report(now, held.Id, held.Version, h, ranges(held.Blocks))
	}
	return &wire.ReportHoldingResponse{}, nil
}

// readable reports whether this server is id's primary, id is a file at
// version, and caller may read it.
func (s *Server) readable(ctx context.Context, caller *wire.Caller, id oid.ID, version uint64) bool {
	if s.primary(id) != nil {
		return false
	}
	err := s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if m.Type != wire.Type_TYPE_FILE || m.Version != version {
			return errSkip
		}
		return s.mayData(caller, m, perm.R)
	})
	return err == nil
}

// errSkip ends a store view whose answer is no.
var errSkip = errors.New("skip")

// Holders implements wire.StorageServer: the clients that recently cached
// the asked blocks of the file's current version, nearest to the asker
// first (paper §5.5).
func (s *Server) Holders(ctx context.Context, req *wire.HoldersRequest) (*wire.HoldersResponse, error) {
	id := oid.ID(req.Id)
	if err := s.checkData(ctx, req.Caller, id, perm.R); err != nil {
		return nil, err
	}
	var version, total uint64
	if err := s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		version = m.GetVersion()
		if bs := uint64(m.GetBlockSize()); bs > 0 {
			total = (m.GetSize() + bs - 1) / bs
		}
		return err
	}); err != nil {
		return nil, err
	}
	resp := &wire.HoldersResponse{Version: version}
	if req.Version != version {
		return resp, nil // the asker reads another version: it asks again
	}
	limit := int(req.Max)
	if limit <= 0 || limit > defaultMaxHolders {
		limit = defaultMaxHolders
	}
	exclude := req.Node
	if name, err := pki.PeerName(ctx); err == nil {
		exclude = name
	}
	now := time.Now()
	// The asked blocks someone holds or is fetching, and those someone
	// at the asker's site does.
	var held, near []holders.Range
	for _, r := range s.holders.Lookup(now, req.Id, version, ranges(req.Blocks), netcoord.FromWire(req.Coord), req.Site, exclude, holdersPerBlock, limit) {
		for _, b := range r.Blocks {
			held = holders.Add(held, b)
			if r.Site == req.Site {
				near = holders.Add(near, b)
			}
		}
		h := &wire.Holder{Node: r.Node, Site: r.Site, RttMs: -1, Addr: r.Addr}
		if r.RTT != netcoord.Unknown {
			h.RttMs = float64(r.RTT) / float64(time.Millisecond)
		}
		for _, b := range r.Blocks {
			h.Blocks = append(h.Blocks, &wire.BlockRange{First: b.First, Count: b.Count})
		}
		resp.Holders = append(resp.Holders, h)
	}
	if req.WantGrant {
		if s.cfg.Grants == nil {
			// Holders serve nobody without a grant: every block is this
			// server's to send.
			resp.Holders, held = nil, nil
		}
		// A grant (with its signer's certificate, most of an answer's
		// bytes) only when the asker has someone to show it to: a reader
		// polling for blocks nobody has yet costs the origin's uplink
		// little.
		if len(resp.Holders) > 0 || s.replicaFor(oid.ID(req.Id).Slice(), req.Site) {
			g, err := s.signGrant(ctx, req, exclude, resp.Holders)
			if err != nil {
				return nil, err
			}
			resp.Grant = g
		}
		for _, r := range s.handOut(now, req, exclude, held, near, total) {
			resp.Direct = append(resp.Direct, &wire.BlockRange{First: r.First, Count: r.Count})
		}
	}
	return resp, nil
}

// replicaFor reports whether sl has a replica besides this server that a
// .Hotspot reader at site may ask (as the client's replicasBeside: not
// one at this server's site unless the reader is there too).
func (s *Server) replicaFor(sl oid.Slice, site string) bool {
	t := s.table.Load()
	if t == nil {
		return false
	}
	for _, id := range t.Slices[sl].Replicas {
		at := t.Servers[id].Site
		if id != s.cfg.ID && (at != s.cfg.Site || at == site) {
			return true
		}
	}
	return false
}

// maxHandOut bounds the blocks one holders query considers handing out.
const maxHandOut = 4096

// handOut picks the asked blocks the asker should read from this server:
// those nobody holds or is fetching, and those it failed to get from the
// sources named before, paced by s.origin for an asker at another site
// (this server's uplink is what every far reader shares; at its own site
// the LAN is free). In the end game (s.origin.HandLast: every one of the
// file's total blocks handed out once) the held blocks nobody at the
// asker's site holds are candidates too, after the others. The asker
// becomes a holder-to-be of every block it will fetch, from holders or
// from here, so that readers after it are sent to it: each block leaves
// the origin about once before the end game.
func (s *Server) handOut(now time.Time, req *wire.HoldersRequest, asker string, held, near []holders.Range, total uint64) []holders.Range {
	tried := ranges(req.Tried)
	s.origin.Failed(now, req.Id, asker, tried)
	var cands, last []uint64
	var fetching []holders.Range // from holders
	for _, r := range ranges(req.Blocks) {
		for idx := r.First; idx < r.First+r.Count && len(cands)+len(last) < maxHandOut; idx++ {
			switch {
			case !holders.Contains(held, idx) || holders.Contains(tried, idx):
				cands = append(cands, idx)
			case !holders.Contains(near, idx):
				last = append(last, idx)
			default:
				fetching = holders.Add(fetching, holders.Range{First: idx, Count: 1})
			}
		}
	}
	direct := cands
	if req.Site != "" && req.Site != s.cfg.Site {
		direct = s.origin.Hand(now, req.Id, asker, req.Site, cands, req.Urgent)
		direct = append(direct, s.origin.HandLast(now, req.Id, asker, req.Site, last, total)...)
	}
	var out []holders.Range
	for _, idx := range direct {
		out = holders.Add(out, holders.Range{First: idx, Count: 1})
	}
	for _, idx := range last {
		if !holders.Contains(out, idx) {
			fetching = holders.Add(fetching, holders.Range{First: idx, Count: 1})
		}
	}
	if req.PeerAddr != "" && asker != "" {
		expect := fetching
		for _, r := range out {
			expect = holders.Add(expect, r)
		}
		s.holders.Expect(now, req.Id, req.Version, holders.Holder{Node: asker, Site: req.Site, Coord: netcoord.FromWire(req.Coord), Addr: req.PeerAddr}, expect)
	}
	return out
}

func ranges(bs []*wire.BlockRange) []holders.Range {
	out := make([]holders.Range, 0, len(bs))
	for _, b := range bs {
		out = append(out, holders.Range{First: b.First, Count: b.Count})
	}
	return out
}

// certSum is the SHA-256 of the certificate g puts in grants (nil: no
// signer).
func certSum(g *blockgrant.Signer) []byte {
	if g == nil {
		return nil
	}
	sum := g.CertSum()
	return sum[:]
}
