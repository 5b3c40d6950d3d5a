// Package cue parses WheelFS semantic cues embedded in path names
// (paper §4.1–4.6), e.g. /wfs/.EventualConsistency/.MaxTime=1000/cache/x.
//
// A cue is a path component naming one of nine cues; it applies to every
// component after it, and a later cue of the same name overrides an earlier
// one. Dot-names that are not cue names (.git, .., .Sitex) are ordinary names.
package cue

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

const (
	DefaultRepLevel = 3
	// MaxRepLevel bounds RepLevel (and SyncLevel, RepSites). The prototype
	// allowed 4; we allow more but keep a bound so replica sets stay sane.
	MaxRepLevel    = 64
	DefaultMaxTime = 0 // meaning no cue given
	// SiteRandom is the .Site value that spreads new objects over all sites.
	SiteRandom = "random"
)

// maxTimeMs is the largest .MaxTime that fits in a time.Duration.
const maxTimeMs = math.MaxInt64 / int64(time.Millisecond)

// ErrMalformed is matched (errors.Is) by every *Error; callers map it to EINVAL.
var ErrMalformed = errors.New("malformed cue")

// Error reports a malformed cue or an invalid combination of cues.
type Error struct {
	Component string // the offending component, e.g. ".MaxTime=abc"
	Reason    string
	kind      Kind // set by Validate so Split can name the user's component
}

func (e *Error) Error() string {
	return fmt.Sprintf("malformed cue %q: %s", e.Component, e.Reason)
}

func (e *Error) Unwrap() error { return ErrMalformed }

// Kind identifies a cue. The zero Kind is no cue; the order of the others is
// the canonical order used by Key and String.
type Kind int

const (
	KindNone Kind = iota
	KindSite
	KindKeepTogether
	KindRepSites
	KindRepLevel
	KindSyncLevel
	KindEventualConsistency
	KindMaxTime
	KindWholeFile
	KindHotspot
	numKinds
)

var kindNames = [numKinds]string{"None", "Site", "KeepTogether", "RepSites",
	"RepLevel", "SyncLevel", "EventualConsistency", "MaxTime", "WholeFile", "Hotspot"}

// byLower maps lower-cased cue names to kinds for case-insensitive lookup.
var byLower = func() map[string]Kind {
	m := make(map[string]Kind, numKinds)
	for k := KindSite; k < numKinds; k++ {
		m[strings.ToLower(kindNames[k])] = k
	}
	return m
}()

func (k Kind) String() string {
	if k < 0 || k >= numKinds {
		return "Kind(" + strconv.Itoa(int(k)) + ")"
	}
	return kindNames[k]
}

// Persistent reports whether the cue is recorded on an object at creation.
// EventualConsistency counts: on a directory it selects union-merge
// reconciliation (§4.5), though for operations it is also transient.
func (k Kind) Persistent() bool {
	switch k {
	case KindSite, KindKeepTogether, KindRepSites, KindRepLevel, KindEventualConsistency:
		return true
	}
	return false
}

// flag reports whether the cue takes no value.
func (k Kind) flag() bool {
	switch k {
	case KindKeepTogether, KindEventualConsistency, KindWholeFile, KindHotspot:
		return true
	}
	return false
}

// Cue is one parsed cue. Str is set for Site, N for the integer cues and D
// for MaxTime.
type Cue struct {
	Kind Kind
	Str  string
	N    int
	D    time.Duration
}

// String returns the cue in canonical path-component form, e.g. ".RepLevel=2".
func (c Cue) String() string { return "." + c.key() }

// key is the canonical form without the leading dot.
func (c Cue) key() string {
	switch {
	case c.Kind == KindSite:
		return "Site=" + c.Str
	case c.Kind == KindMaxTime:
		return "MaxTime=" + strconv.FormatInt(int64(c.D/time.Millisecond), 10)
	case c.Kind.flag():
		return c.Kind.String()
	}
	return c.Kind.String() + "=" + strconv.Itoa(c.N)
}

// lookup returns the kind named by component (with leading dot), ignoring
// ASCII case and any "=value", or KindNone.
func lookup(component string) Kind {
	if len(component) < 2 || component[0] != '.' {
		return KindNone
	}
	name, _, _ := strings.Cut(component[1:], "=")
	// ASCII-only folding: strings.EqualFold would also accept e.g. the Kelvin
	// sign for 'K', making odd Unicode names silently act as cues.
	for i := 0; i < len(name); i++ {
		if name[i] >= 0x80 {
			return KindNone
		}
	}
	return byLower[strings.ToLower(name)]
}

// IsCue reports whether a single path component is a cue name (well-formed or not).
func IsCue(component string) bool { return lookup(component) != KindNone }

// ParseComponent parses one component. ok=false means it is an ordinary name
// (err is then nil); ok=true with a non-nil err means a malformed cue.
func ParseComponent(component string) (c Cue, ok bool, err error) {
	k := lookup(component)
	if k == KindNone {
		return Cue{}, false, nil
	}
	bad := func(reason string) (Cue, bool, error) {
		return Cue{}, true, &Error{Component: component, Reason: reason}
	}
	_, val, hasVal := strings.Cut(component, "=")
	if k.flag() {
		if hasVal {
			return bad("takes no value")
		}
		return Cue{Kind: k}, true, nil
	}
	if !hasVal || val == "" {
		return bad("missing value")
	}
	if k == KindSite {
		if !validSite(val) {
			return bad("site name must be letters, digits, '.', '-' or '_'")
		}
		if strings.EqualFold(val, SiteRandom) {
			val = SiteRandom
		}
		return Cue{Kind: k, Str: val}, true, nil
	}
	for i := 0; i < len(val); i++ {
		if val[i] < '0' || val[i] > '9' {
			return bad("value must be a positive integer")
		}
	}
	n, err := strconv.ParseInt(val, 10, 64)
	if err != nil || n <= 0 {
		return bad("value must be a positive integer")
	}
	if k == KindMaxTime {
		if n > maxTimeMs {
			return bad("value too large")
		}
		return Cue{Kind: k, D: time.Duration(n) * time.Millisecond}, true, nil
	}
	if n > MaxRepLevel {
		return bad(fmt.Sprintf("value above maximum %d", MaxRepLevel))
	}
	return Cue{Kind: k, N: int(n)}, true, nil
}

func validSite(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
