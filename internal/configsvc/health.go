package configsvc

// Health is a slice's replication health, as the maintenance loop and
// `wheelfs status` judge it.
type Health struct {
	// Live is the number of replicas registered in the server table.
	Live int `json:"live"`
	// Sites is the number of distinct sites among the live replicas.
	Sites int `json:"sites"`
	// WantSites is the number of distinct sites the policy asks for,
	// capped by the number of sites that have a registered server.
	WantSites int `json:"want_sites"`
	// UnderReplicated: fewer live replicas than Policy.RepLevel.
	UnderReplicated bool `json:"under_replicated"`
	// Misplaced: the primary is not at Policy.Site although a server that
	// is not full is registered there, or the live replicas span fewer than WantSites sites.
	Misplaced bool `json:"misplaced"`
	// Down lists replicas that are not registered, in replica-list order.
	Down []string `json:"down,omitempty"`
}

// OK reports whether the slice needs no repair.
func (h Health) OK() bool { return !h.UnderReplicated && !h.Misplaced }

// Check judges slice s against the servers registered in t:
//
//   - live replicas are the replicas registered in t.Servers;
//   - under-replicated: live < Policy.RepLevel (or < the number of
//     registered servers, when there are fewer);
//   - want sites: Policy.RepSites, or RepLevel when RepSites is 0, capped by
//     the number of distinct sites among registered servers;
//   - misplaced: the primary's site differs from Policy.Site (when that is
//     set and some registered server there is not full), or the live replicas span
//     fewer distinct sites than wanted.
//
// The primary is Replicas[0] (the lock holder for an empty list). A primary
// that is not registered is down, not misplaced.
func Check(t *Table, s Slice) Health {
	var h Health
	liveSites := map[string]bool{}
	for _, id := range s.Replicas {
		info, ok := t.Servers[id]
		if !ok {
			h.Down = append(h.Down, id)
			continue
		}
		h.Live++
		liveSites[info.Site] = true
	}
	h.Sites = len(liveSites)
	// Fewer servers than RepLevel: every server holding a copy is enough.
	h.UnderReplicated = h.Live < max(1, min(s.Policy.RepLevel, len(t.Servers)))

	allSites := map[string]bool{}
	for _, info := range t.Servers {
		allSites[info.Site] = true
	}
	h.WantSites = s.Policy.RepSites
	if h.WantSites == 0 {
		h.WantSites = s.Policy.RepLevel
	}
	h.WantSites = min(h.WantSites, len(allSites))

	// A home site whose servers are all full cannot take the slice: it
	// is where it should be for now (placement falls back the same way).
	roomAtHome := false
	for _, info := range t.Servers {
		roomAtHome = roomAtHome || info.Site == s.Policy.Site && !info.Full
	}
	if s.Policy.Site != "" && roomAtHome {
		primary := s.Holder
		if len(s.Replicas) > 0 {
			primary = s.Replicas[0]
		}
		if info, ok := t.Servers[primary]; ok && info.Site != s.Policy.Site {
			h.Misplaced = true
		}
	}
	if h.Sites < h.WantSites {
		h.Misplaced = true
	}
	return h
}
