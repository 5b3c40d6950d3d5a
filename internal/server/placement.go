package server

import (
	"cmp"
	"hash/fnv"
	"slices"

	"github.com/wheelfs/wheelfs/internal/configsvc"
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
func (s *Server) chooseReplicas(p configsvc.Policy, keep []string) []string {
	t := s.table.Load()
	servers := map[string]configsvc.ServerInfo{s.cfg.ID: {ID: s.cfg.ID, Site: s.cfg.Site}}
	if t != nil {
		for id, si := range t.Servers {
			servers[id] = si
		}
	}
	return placeReplicas(p, keep, servers)
}

// placeReplicas is chooseReplicas over a given server registry.
func placeReplicas(p configsvc.Policy, keep []string, servers map[string]configsvc.ServerInfo) []string {
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
	nSites := wantSites(p, len(bySite))
	// Kept backups first count towards their sites.
	chosenSites := []string{home}
	hasSite := map[string]bool{home: true}
	add := func(id string) {
		if len(out) < want && !in[id] {
			out = append(out, id)
			in[id] = true
		}
	}
	for _, id := range keep[1:] {
		si, ok := servers[id]
		if !ok || in[id] {
			continue
		}
		if !hasSite[si.Site] && len(chosenSites) >= nSites {
			continue // would exceed the wanted number of sites
		}
		if !hasSite[si.Site] {
			hasSite[si.Site] = true
			chosenSites = append(chosenSites, si.Site)
		}
		add(id)
	}
	// One server at each further site, up to the wanted number.
	for _, site := range others {
		if len(chosenSites) >= nSites {
			break
		}
		if hasSite[site] {
			continue
		}
		for _, id := range bySite[site] {
			if !in[id] {
				hasSite[site] = true
				chosenSites = append(chosenSites, site)
				add(id)
				break
			}
		}
	}
	// Extra copies: at the primary's site first, then the other chosen
	// sites, then anywhere.
	for _, site := range chosenSites {
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

// siteServers returns the registered servers at site, in a stable
// pseudo-random order for salt.
func (s *Server) siteServers(site, salt string) []string {
	t := s.table.Load()
	var ids []string
	if t != nil {
		for id, si := range t.Servers {
			if si.Site == site {
				ids = append(ids, id)
			}
		}
	}
	spread(ids, salt)
	return ids
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
