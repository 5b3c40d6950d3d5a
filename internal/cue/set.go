package cue

import (
	"fmt"
	"strings"
	"time"
)

// Set is the combination of cues in force for an operation or object. Zero
// fields mean "not given"; HasSite is true exactly when Site is set.
type Set struct {
	Site                string
	HasSite             bool
	KeepTogether        bool
	RepSites            int // 0 = not given
	RepLevel            int // 0 = not given
	SyncLevel           int // 0 = not given
	EventualConsistency bool
	MaxTime             time.Duration // 0 = not given
	WholeFile           bool
	Hotspot             bool
}

// Apply returns s with c applied (later overrides earlier).
func (s Set) Apply(c Cue) Set {
	switch c.Kind {
	case KindSite:
		s.Site, s.HasSite = c.Str, true
	case KindKeepTogether:
		s.KeepTogether = true
	case KindRepSites:
		s.RepSites = c.N
	case KindRepLevel:
		s.RepLevel = c.N
	case KindSyncLevel:
		s.SyncLevel = c.N
	case KindEventualConsistency:
		s.EventualConsistency = true
	case KindMaxTime:
		s.MaxTime = c.D
	case KindWholeFile:
		s.WholeFile = true
	case KindHotspot:
		s.Hotspot = true
	}
	return s
}

// Cues returns the cues of s in canonical order.
func (s Set) Cues() []Cue {
	var cs []Cue
	add := func(ok bool, c Cue) {
		if ok {
			cs = append(cs, c)
		}
	}
	add(s.HasSite, Cue{Kind: KindSite, Str: s.Site})
	add(s.KeepTogether, Cue{Kind: KindKeepTogether})
	add(s.RepSites != 0, Cue{Kind: KindRepSites, N: s.RepSites})
	add(s.RepLevel != 0, Cue{Kind: KindRepLevel, N: s.RepLevel})
	add(s.SyncLevel != 0, Cue{Kind: KindSyncLevel, N: s.SyncLevel})
	add(s.EventualConsistency, Cue{Kind: KindEventualConsistency})
	add(s.MaxTime != 0, Cue{Kind: KindMaxTime, D: s.MaxTime})
	add(s.WholeFile, Cue{Kind: KindWholeFile})
	add(s.Hotspot, Cue{Kind: KindHotspot})
	return cs
}

// EffectiveRepLevel returns RepLevel or DefaultRepLevel.
func (s Set) EffectiveRepLevel() int {
	if s.RepLevel != 0 {
		return s.RepLevel
	}
	return DefaultRepLevel
}

// EffectiveSyncLevel returns SyncLevel or the effective RepLevel.
func (s Set) EffectiveSyncLevel() int {
	if s.SyncLevel != 0 {
		return s.SyncLevel
	}
	return s.EffectiveRepLevel()
}

// Validate checks the combined set: every field in range, and SyncLevel and
// RepSites not above the effective RepLevel (neither can be met otherwise).
func (s Set) Validate() error {
	bad := func(c Cue, format string, args ...any) error {
		return &Error{Component: c.String(), Reason: fmt.Sprintf(format, args...), kind: c.Kind}
	}
	if s.HasSite != (s.Site != "") || s.HasSite && !validSite(s.Site) {
		return bad(Cue{Kind: KindSite, Str: s.Site}, "invalid site name")
	}
	for _, c := range []Cue{{Kind: KindRepSites, N: s.RepSites}, {Kind: KindRepLevel, N: s.RepLevel},
		{Kind: KindSyncLevel, N: s.SyncLevel}} {
		if c.N < 0 || c.N > MaxRepLevel {
			return bad(c, "value out of range 1..%d", MaxRepLevel)
		}
	}
	if s.MaxTime < 0 || s.MaxTime%time.Millisecond != 0 {
		return bad(Cue{Kind: KindMaxTime, D: s.MaxTime}, "must be a positive whole number of milliseconds")
	}
	rl := s.EffectiveRepLevel()
	if s.SyncLevel > rl {
		return bad(Cue{Kind: KindSyncLevel, N: s.SyncLevel}, "exceeds replication level %d", rl)
	}
	if s.RepSites > rl {
		return bad(Cue{Kind: KindRepSites, N: s.RepSites}, "exceeds replication level %d", rl)
	}
	return nil
}

// Persistent returns only the part recorded on an object at creation.
func (s Set) Persistent() Set {
	return Set{Site: s.Site, HasSite: s.HasSite, KeepTogether: s.KeepTogether,
		RepSites: s.RepSites, RepLevel: s.RepLevel, EventualConsistency: s.EventualConsistency}
}

func (s Set) IsZero() bool { return s == Set{} }

// Key returns a canonical string of s ("" for the empty set), e.g.
// "EventualConsistency,MaxTime=1000". It is stable so callers can derive
// inode numbers from (object, Key); Parse inverts it.
func (s Set) Key() string {
	var b strings.Builder
	for i, c := range s.Cues() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(c.key())
	}
	return b.String()
}

// String returns s in canonical path form, e.g. "/.EventualConsistency/.MaxTime=1000".
func (s Set) String() string {
	var b strings.Builder
	for _, c := range s.Cues() {
		b.WriteByte('/')
		b.WriteString(c.String())
	}
	return b.String()
}

// Map returns the given fields of s, for JSON display. MaxTime is in
// milliseconds. For an object's recorded cues use s.Persistent().Map().
func (s Set) Map() map[string]any {
	m := map[string]any{}
	for _, c := range s.Cues() {
		switch {
		case c.Kind == KindSite:
			m["Site"] = c.Str
		case c.Kind == KindMaxTime:
			m["MaxTime"] = int64(c.D / time.Millisecond)
		case c.Kind.flag():
			m[c.Kind.String()] = true
		default:
			m[c.Kind.String()] = c.N
		}
	}
	return m
}

// Parse parses a Key string back into a Set. It rejects malformed cues but,
// unlike Split, does not call Validate, so Parse(s.Key()) == s for any Set
// whose fields are individually well-formed.
func Parse(key string) (Set, error) {
	var s Set
	if key == "" {
		return s, nil
	}
	for _, tok := range strings.Split(key, ",") {
		c, ok, err := ParseComponent("." + tok)
		if err != nil {
			return Set{}, err
		}
		if !ok {
			return Set{}, &Error{Component: tok, Reason: "not a cue name"}
		}
		s = s.Apply(c)
	}
	return s, nil
}

// Component is an ordinary path component with the cues in force for it.
type Component struct {
	Name string
	Cues Set
}

// Split parses a slash-separated path (absolute or relative; empty components
// are skipped) into its ordinary components, each with the Set of cues
// appearing before it, and final, the Set of all cues in the path. Trailing
// cues therefore show up only in final. Every Set returned is validated,
// since each is used for some operation.
func Split(path string) (comps []Component, final Set, err error) {
	var raw [numKinds]string // the component that last set each kind
	validate := func() error {
		err := final.Validate()
		if e, ok := err.(*Error); ok && raw[e.kind] != "" {
			e.Component = raw[e.kind]
		}
		return err
	}
	for _, name := range strings.Split(path, "/") {
		if name == "" {
			continue
		}
		c, ok, err := ParseComponent(name)
		if err != nil {
			return nil, Set{}, err
		}
		if ok {
			final = final.Apply(c)
			raw[c.Kind] = name
			continue
		}
		if err := validate(); err != nil {
			return nil, Set{}, err
		}
		comps = append(comps, Component{Name: name, Cues: final})
	}
	if err := validate(); err != nil {
		return nil, Set{}, err
	}
	return comps, final, nil
}
