package server

import (
	"cmp"
	"context"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Placement (paper §4.3, §5.2.2–5.2.3).

// wantSites is how many distinct sites a policy asks for: RepSites, or
// as many as replicas when unset, at most the sites that have servers.
func wantSites(p configsvc.Policy, sites int) int {
	w := p.RepSites
	if w <= 0 {
		w = p.RepLevel
	}
	return max(1, min(w, sites))
}

// spread orders xs by a hash of (salt, x): a stable pseudo-random order
// that differs per slice, so slices spread over servers and sites.
func spread(xs []string, salt string) {
	h := func(x string) uint64 {
		f := fnv.New64a()
		f.Write([]byte(salt))
		f.Write([]byte{0})
		f.Write([]byte(x))
		return f.Sum64()
	}
	slices.SortFunc(xs, func(a, b string) int { return cmp.Compare(h(a), h(b)) })
}

// chooseReplicas returns a replica list for policy p that starts with
// keep[0] (the primary) and keeps the other servers of keep that are
// still registered where they fit, filling up to RepLevel from the
// registered servers: first one server at each of the wanted number of
// sites (the primary's site first), then extra copies at the primary's
// site, then at the other chosen sites, then anywhere.
//
// Sites in prefer (those of replaced backups) come first among the other
// sites: a dead backup is replaced at its own site if possible. A full
// server is chosen only if keep has it already (it holds the data).
func (s *Server) chooseReplicas(p configsvc.Policy, keep []string, prefer ...string) []string {
	t := s.table.Load()
	servers := map[string]configsvc.ServerInfo{s.cfg.ID: {ID: s.cfg.ID, Site: s.cfg.Site}}
	if t != nil {
		for id, si := range t.Servers {
			if !s.suspected(id) && (!si.Full || slices.Contains(keep, id)) {
				servers[id] = si
			}
		}
	}
	return placeReplicas(p, keep, servers, prefer...)
}

// suspect records that server id failed to answer; clear forgets it.
func (s *Server) suspect(id string) {
	s.maint.mu.Lock()
	if _, ok := s.maint.suspects[id]; !ok {
		s.maint.suspects[id] = time.Now()
	}
	s.maint.mu.Unlock()
}

func (s *Server) clearSuspect(id string) {
	s.maint.mu.Lock()
	delete(s.maint.suspects, id)
	s.maint.mu.Unlock()
}

// suspected reports whether id failed recently (within a few DeadAfter
// periods, after which its membership would have expired if it were down).
func (s *Server) suspected(id string) bool {
	s.maint.mu.Lock()
	defer s.maint.mu.Unlock()
	at, ok := s.maint.suspects[id]
	if ok && time.Since(at) > 4*s.cfg.DeadAfter {
		delete(s.maint.suspects, id)
		return false
	}
	return ok
}

// keepFloor returns want with backups of the current list old added back
// (in old's order) until it has as many replicas as old had, up to the
// policy's RepLevel: a backup leaves a replica list only when another
// server takes its place. A backup that is down stays listed, so writes
// wait for it (or a replacement) rather than being acknowledged by fewer
// replicas than the list promised, and a restarting peer finds its place
// again. The paper replaces an unreachable backup "in place of the old
// one" (§5.3); without a replacement there is nothing to shrink to.
func keepFloor(want, old []string, repLevel int) []string {
	floor := min(max(1, repLevel), len(old))
	out := slices.Clone(want)
	for _, id := range old {
		if len(out) >= floor {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// deploymentSize is how many servers the deployment has: the registered
// ones and every server named in a replica list (paper §5.2.1: membership
// is the union of the replica lists), so that a server briefly down still
// counts. It caps how many replicas a write can wait for. It is read from
// the local table, which can lag: see confirmedSize.
func (s *Server) deploymentSize() int {
	t := s.table.Load()
	if t == nil {
		return 1
	}
	if c := s.sizeCache.Load(); c != nil && c.table == t {
		return c.n
	}
	n := sizeOfTable(t, s.cfg.ID)
	s.sizeCache.Store(&sizeOf{table: t, n: n})
	return n
}

func sizeOfTable(t *configsvc.Table, self string) int {
	ids := map[string]bool{self: true}
	for id := range t.Servers {
		ids[id] = true
	}
	for _, sl := range t.Slices {
		for _, id := range sl.Replicas {
			ids[id] = true
		}
	}
	return len(ids)
}

// sizeOf caches deploymentSize for one table.
type sizeOf struct {
	table *configsvc.Table
	n     int
}

// sizeConfirmFor is how long a deployment size read from the
// configuration service stands in for the local table's. A server that
// registers within it may not yet count toward a write: it holds no
// copy of anything yet either.
const sizeConfirmFor = time.Second

// sizeCheck is the last deployment size read from the configuration
// service itself.
type sizeCheck struct {
	mu sync.Mutex
	n  int
	at time.Time
}

// need is how many copies (this one included) an update of r's slice at
// sync level sync waits for: sync, or the slice's RepLevel for 0, capped
// by what the deployment has. The cap is never taken from the local table
// alone: right after start, or while cut off from the configuration
// service, that table may not list servers that exist, and a write would
// be acknowledged with fewer copies than promised. A size that caps is
// confirmed by a read of the configuration service; if that read fails
// nothing is capped, and the write waits for its replicas (within its
// call's bound) like any other.
func (s *Server) need(ctx context.Context, r *sliceRepl, sync uint32) int {
	n := int(sync)
	if n <= 0 {
		n = r.repLevel
	}
	if n <= s.deploymentSize() {
		return n
	}
	size, err := s.confirmedSize(ctx)
	if err != nil {
		s.log.Debug("deployment size unconfirmed; waiting for every copy the policy asks for", "want", n, "err", err)
		return n
	}
	return min(n, size)
}

// confirmedSize reads the deployment size from the configuration service
// at most once per sizeConfirmFor (callers meanwhile share the answer),
// and adopts the table read if it is newer than the local one, so that
// maintenance recruits the servers it names.
func (s *Server) confirmedSize(ctx context.Context) (int, error) {
	c := &s.sizeCheck
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < sizeConfirmFor {
		return c.n, nil
	}
	t, err := s.conf.Table(ctx)
	if err != nil {
		return 0, err
	}
	c.n, c.at = sizeOfTable(t, s.cfg.ID), time.Now()
	if old := s.table.Load(); old == nil || t.Revision > old.Revision {
		s.table.CompareAndSwap(old, t)
		select {
		case s.tableC <- struct{}{}:
		default:
		}
	}
	return c.n, nil
}

// placeReplicas is chooseReplicas over a given server registry.
func placeReplicas(p configsvc.Policy, keep []string, servers map[string]configsvc.ServerInfo, prefer ...string) []string {
	want := max(1, p.RepLevel)
	primary := keep[0]
	out := []string{primary}
	in := map[string]bool{primary: true}
	bySite := map[string][]string{}
	for id, si := range servers {
		bySite[si.Site] = append(bySite[si.Site], id)
	}
	salt := primary + "/" + p.Site
	for _, ids := range bySite {
		spread(ids, salt)
	}
	home := servers[primary].Site
	var others []string
	for site := range bySite {
		if site != home {
			others = append(others, site)
		}
	}
	spread(others, salt)
	slices.SortStableFunc(others, func(a, b string) int {
		return cmp.Compare(btoi(!slices.Contains(prefer, a)), btoi(!slices.Contains(prefer, b)))
	})
	nSites := wantSites(p, len(bySite))
	chosen := []string{home}
	isChosen := map[string]bool{home: true}
	add := func(id string) bool {
		if len(out) >= want || in[id] {
			return false
		}
		out = append(out, id)
		in[id] = true
		return true
	}
	choose := func(id string) {
		site := servers[id].Site
		if add(id) && !isChosen[site] {
			isChosen[site] = true
			chosen = append(chosen, site)
		}
	}
	// 1. Kept backups at sites not yet covered, up to the wanted number.
	for _, id := range keep[1:] {
		if si, ok := servers[id]; ok && !isChosen[si.Site] && len(chosen) < nSites {
			choose(id)
		}
	}
	// 2. New servers at further sites, up to the wanted number.
	for _, site := range others {
		if len(chosen) >= nSites {
			break
		}
		if !isChosen[site] && len(bySite[site]) > 0 {
			choose(bySite[site][0])
		}
	}
	// 3. Kept backups at covered sites (extra copies stay where they are).
	for _, id := range keep[1:] {
		if si, ok := servers[id]; ok && isChosen[si.Site] {
			add(id)
		}
	}
	// 4. Extra copies: at the primary's site first, then the other chosen
	// sites, then anywhere.
	for _, site := range chosen {
		for _, id := range bySite[site] {
			add(id)
		}
	}
	for _, site := range others {
		for _, id := range bySite[site] {
			add(id)
		}
	}
	return out
}

// policyFromCues reads a slice policy sent in a Cues message.
func policyFromCues(c *wire.Cues) configsvc.Policy {
	return configsvc.Policy{Site: c.GetSite(), RepLevel: int(c.GetRepLevel()), RepSites: int(c.GetRepSites()),
		KeepTogether: c.GetKeepTogether(), EventualDirs: c.GetEventual()}
}

// cuesFromPolicy is the inverse of policyFromCues.
func cuesFromPolicy(p configsvc.Policy) *wire.Cues {
	return &wire.Cues{Site: p.Site, RepLevel: int32(p.RepLevel), RepSites: int32(p.RepSites),
		KeepTogether: p.KeepTogether, Eventual: p.EventualDirs}
}

// siteServers returns the registered servers at site that are neither
// suspected of being down nor full, in a stable pseudo-random order for
// salt.
func (s *Server) siteServers(site, salt string) []string {
	t := s.table.Load()
	var ids []string
	if t != nil {
		for id, si := range t.Servers {
			if si.Site == site && !s.suspected(id) && !s.full(id) {
				ids = append(ids, id)
			}
		}
	}
	spread(ids, salt)
	return ids
}

// withRoom returns a server for new data: this one unless it is full,
// else one with room at this site, else anywhere (this one if none has).
func (s *Server) withRoom(salt string) string {
	if !s.selfFull() {
		return s.cfg.ID
	}
	if ids := s.siteServers(s.cfg.Site, salt); len(ids) > 0 {
		return ids[0]
	}
	var ids []string
	if t := s.table.Load(); t != nil {
		for id, si := range t.Servers {
			if !si.Full && !s.suspected(id) && id != s.cfg.ID {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return s.cfg.ID
	}
	spread(ids, salt)
	return ids[0]
}

// registered reports whether server id holds a live membership.
func (s *Server) registered(id string) bool {
	if id == s.cfg.ID {
		return true
	}
	t := s.table.Load()
	if t == nil {
		return false
	}
	_, ok := t.Servers[id]
	return ok
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func policyOf(c *wire.Cues, parent configsvc.Policy, site string) configsvc.Policy {
	p := configsvc.Policy{Site: site, RepLevel: DefaultRepLevel}
	if c == nil {
		return p
	}
	if c.KeepTogether {
		p = parent
		p.KeepTogether = true
	}
	if c.Site != "" {
		p.Site = c.Site
	}
	if c.RepLevel > 0 {
		p.RepLevel = int(c.RepLevel)
	}
	if c.RepSites > 0 {
		p.RepSites = int(c.RepSites)
	}
	p.EventualDirs = c.Eventual
	return p
}

// place decides the new object's slice policy and the server to store it.
func (s *Server) place(req *wire.CreateRequest, dir oid.ID) (configsvc.Policy, string) {
	parent, ok := s.owned.policy(dir.Slice())
	if !ok {
		parent = s.defaultPolicy()
	}
	pol := policyOf(req.Cues, parent, s.cfg.Site)
	cues := req.GetCues()
	switch {
	case cues.GetKeepTogether():
		parent.KeepTogether = true
		return parent, s.cfg.ID // the directory's own slice
	case cues.GetSite() == cue.SiteRandom:
		if t := s.table.Load(); t != nil {
			ids := make([]string, 0, len(t.Servers))
			for id := range t.Servers {
				if !s.suspected(id) && !s.full(id) {
					ids = append(ids, id)
				}
			}
			if len(ids) > 0 {
				id := ids[rand.IntN(len(ids))]
				pol.Site = t.Servers[id].Site
				return pol, id
			}
		}
		pol.Site = s.cfg.Site
		return pol, s.cfg.ID
	case cues.GetSite() != "":
		if pol.Site == s.cfg.Site && !s.selfFull() {
			return pol, s.cfg.ID
		}
		if ids := s.siteServers(pol.Site, req.Name); len(ids) > 0 {
			return pol, ids[0]
		}
		// Nobody there, or no room: here (or where there is room) for
		// now, home later.
		return pol, s.withRoom(req.Name)
	}
	// Write-local: the creating client's own server, else a server at
	// the client's site; a full one is passed over (the policy keeps its
	// site: the object moves there once there is room).
	if o := req.Origin; o != "" && o != s.cfg.ID && s.registered(o) && !s.suspected(o) && !s.full(o) {
		if t := s.table.Load(); t != nil {
			pol.Site = t.Servers[o].Site
			return pol, o
		}
	}
	if cs := req.ClientSite; req.Origin == "" && cs != "" && cs != s.cfg.Site {
		if ids := s.siteServers(cs, req.Name); len(ids) > 0 {
			pol.Site = cs
			return pol, ids[0]
		}
	}
	return pol, s.withRoom(req.Name)
}
