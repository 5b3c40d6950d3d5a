package client

import (
	"cmp"
	"context"
	"crypto/sha256"
	"slices"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/blockgrant"
	"github.com/wheelfs/wheelfs/internal/netcoord"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Without any cue, a block whose primary is at another site is read from
// a replica at this client's site when there is one (issue 12 item 5), or
// else from a replica elsewhere that is clearly nearer than the primary:
// the primary answers the block list (GetBlocks, so the version check
// still goes to it and close-to-open holds) with a grant for the listed
// blocks, which the replica checks as it does a .Hotspot reader's. A
// replica that fails or sends a block whose SHA-256 is not the one asked
// for leaves the blocks to the primary.

// nearGrant is a grant for blocks of one file, to a user of this client,
// for a replica nearer than the primary.
type nearGrant struct {
	g       *wire.Grant
	uid     uint32
	hashes  map[[32]byte]bool
	expires time.Time
}

// nearGrants keeps the grants the primaries sent with block lists.
type nearGrants struct {
	mu     sync.Mutex
	byFile map[oid.ID][]nearGrant
}

// Bounds of the grants kept: files, and grants per file (one per 1 024
// blocks listed).
const (
	maxNearGrantFiles = 256
	maxNearGrants     = 16
)

// nearGrantMargin is the life a grant must have left to be shown: the
// replica checks it after a request's trip.
const nearGrantMargin = 2 * time.Second

// add keeps g, a grant for blocks of id.
func (n *nearGrants) add(id oid.ID, g *wire.Grant) {
	b, err := blockgrant.Body(g)
	if err != nil {
		return
	}
	ng := nearGrant{g: g, uid: b.Uid, hashes: blockgrant.Hashes(b), expires: time.UnixMilli(b.ExpiresUnixMs)}
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.byFile == nil || (n.byFile[id] == nil && len(n.byFile) >= maxNearGrantFiles) {
		n.byFile = map[oid.ID][]nearGrant{}
	}
	gs := slices.DeleteFunc(n.byFile[id], func(x nearGrant) bool { return now.After(x.expires) })
	if len(gs) >= maxNearGrants {
		gs = gs[1:]
	}
	n.byFile[id] = append(gs, ng)
}

// forFile returns a live grant of id to uid naming every one of hashes
// (another user's would show the replica what that user may read).
func (n *nearGrants) forFile(id oid.ID, uid uint32, hashes [][32]byte) *wire.Grant {
	deadline := time.Now().Add(nearGrantMargin)
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range slices.Backward(n.byFile[id]) {
		if x.uid == uid && x.expires.After(deadline) && !slices.ContainsFunc(hashes, func(h [32]byte) bool { return !x.hashes[h] }) {
			return x.g
		}
	}
	return nil
}

// askNearGrants makes sure, when a replica is nearer than st's primary
// (nearReplicas), that a grant names the blocks from..to for it: it asks the primary for the block list of each refsPerFetch
// window no live grant covers yet (GetBlocks with this site), one round
// trip per window to the primary, which the blocks would cross otherwise.
// Called under st.mu.
func (st *fileState) askNearGrants(ctx context.Context, f *FS, u User, from, to uint64) {
	if st.eventual || st.noNearGrant || st.modified || len(f.nearReplicas(ctx, st.id)) == 0 {
		return
	}
	for first := from; first <= to; first += refsPerFetch {
		var hashes [][32]byte
		for idx := first; idx <= min(to, first+refsPerFetch-1); idx++ {
			if r, ok := st.hashes[idx]; ok && !f.cache.Contains(r.hash) {
				hashes = append(hashes, r.hash)
			}
		}
		if len(hashes) == 0 || f.near.forFile(st.id, u.Uid, hashes) != nil {
			continue
		}
		req := &wire.GetBlocksRequest{Caller: u.caller(), Id: uint64(st.id), First: first, Count: refsPerFetch, Site: f.cfg.Site}
		have, haveCert := f.peer.haveCert()
		req.HaveCert = haveCert
		resp, err := call(ctx, f, st.id, wire.StorageClient.GetBlocks, req)
		if err != nil || resp.GetMeta().GetVersion() != st.version {
			return // the read itself asks the primary, and finds out
		}
		if resp.Grant == nil {
			st.noNearGrant = true
			return
		}
		f.noteNearGrant(st.id, resp, have)
	}
}

// noteNearGrant keeps the grant resp brings (GetBlocks of id).
func (f *FS) noteNearGrant(id oid.ID, resp *wire.GetBlocksResponse, have [32]byte) {
	if g := resp.GetGrant(); g != nil && f.peer.fillCert(g, have) {
		f.near.add(id, g)
	}
}

// nearerBy is how much nearer than the primary (by network coordinates)
// a replica at another site must seem to be read from: estimates err.
const nearerBy = 0.7

// nearReplicas returns, when id's primary is at another site, the
// replicas of its slice to read its blocks from first: those at this
// client's site, else those at other sites (not the primary's) whose
// estimated round trip is below nearerBy times the primary's, nearest
// first. Plain .WholeFile prefetches thus read from the nearest replica.
func (f *FS) nearReplicas(ctx context.Context, id oid.ID) []Conn {
	if f.cfg.Site == "" {
		return nil
	}
	info, err := f.router.Describe(ctx, id.Slice())
	if err != nil || info.Primary.Site == f.cfg.Site {
		return nil
	}
	conns, err := f.router.Replicas(ctx, id.Slice())
	if err != nil {
		return nil
	}
	conns = slices.DeleteFunc(conns, func(c Conn) bool { return c.ID == info.Primary.Server || c.Site == info.Primary.Site })
	if own := slices.DeleteFunc(slices.Clone(conns), func(c Conn) bool { return c.Site != f.cfg.Site }); len(own) > 0 || f.cfg.Coord == nil {
		return own
	}
	primary := f.cfg.Coord.EstimateTo(info.Primary.Server)
	if primary == netcoord.Unknown {
		return nil
	}
	est := map[string]time.Duration{}
	conns = slices.DeleteFunc(conns, func(c Conn) bool {
		est[c.ID] = f.cfg.Coord.EstimateTo(c.ID)
		return est[c.ID] == netcoord.Unknown || float64(est[c.ID]) >= nearerBy*float64(primary)
	})
	slices.SortFunc(conns, func(a, b Conn) int { return cmp.Compare(est[a.ID], est[b.ID]) })
	return conns
}

// fromNearReplica reads blocks hashes of id from a replica nearer than
// the primary (nearReplicas) with a grant the primary sent, and returns their
// contents, or nil when there is no such replica or grant, or none
// served them all intact (the caller reads them from the primary).
func (f *FS) fromNearReplica(ctx context.Context, u User, id oid.ID, hashes [][32]byte) [][]byte {
	g := f.near.forFile(id, u.Uid, hashes)
	if g == nil {
		return nil
	}
	req := &wire.ReadBlocksRequest{Caller: u.caller(), Id: uint64(id), Grant: g, Hashes: make([][]byte, len(hashes))}
	for i := range hashes {
		req.Hashes[i] = hashes[i][:]
	}
	for _, c := range f.nearReplicas(ctx, id) {
		try := maxAttempt
		if dl, ok := ctx.Deadline(); ok {
			try = min(try, time.Until(dl)/5)
		}
		tctx, cancel := context.WithTimeout(ctx, try)
		resp, err := c.ReadBlocks(tctx, req)
		cancel()
		if err != nil || len(resp.Data) != len(hashes) {
			f.log.Debug("nearer replica did not serve blocks", "server", c.ID, "id", id.String(), "err", err)
			continue
		}
		intact := true
		for i, b := range resp.Data {
			intact = intact && sha256.Sum256(b) == hashes[i]
		}
		if !intact {
			f.log.Warn("nearer replica sent a block that is not the one asked for", "server", c.ID, "id", id.String())
			continue
		}
		for _, b := range resp.Data {
			f.peer.fromReplicas.Add(int64(len(b)))
		}
		return resp.Data
	}
	return nil
}
