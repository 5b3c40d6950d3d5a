package cue

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

const ms = time.Millisecond

var wellFormed = []struct {
	in   string
	want Cue
}{
	{".Site=westcoast", Cue{Kind: KindSite, Str: "westcoast"}},
	{".Site=rice.edu", Cue{Kind: KindSite, Str: "rice.edu"}},
	{".site=MIT_csail-1", Cue{Kind: KindSite, Str: "MIT_csail-1"}},
	{".Site=random", Cue{Kind: KindSite, Str: SiteRandom}},
	{".SITE=RanDom", Cue{Kind: KindSite, Str: SiteRandom}},
	{".KeepTogether", Cue{Kind: KindKeepTogether}},
	{".keeptogether", Cue{Kind: KindKeepTogether}},
	{".RepSites=2", Cue{Kind: KindRepSites, N: 2}},
	{".repsites=64", Cue{Kind: KindRepSites, N: 64}},
	{".RepLevel=1", Cue{Kind: KindRepLevel, N: 1}},
	{".REPLEVEL=64", Cue{Kind: KindRepLevel, N: 64}},
	{".RepLevel=007", Cue{Kind: KindRepLevel, N: 7}},
	{".SyncLevel=2", Cue{Kind: KindSyncLevel, N: 2}},
	{".EventualConsistency", Cue{Kind: KindEventualConsistency}},
	{".eventualCONSISTENCY", Cue{Kind: KindEventualConsistency}},
	{".MaxTime=1000", Cue{Kind: KindMaxTime, D: 1000 * ms}},
	{".maxtime=1", Cue{Kind: KindMaxTime, D: ms}},
	{".WholeFile", Cue{Kind: KindWholeFile}},
	{".wholefile", Cue{Kind: KindWholeFile}},
	{".Hotspot", Cue{Kind: KindHotspot}},
	{".HotSpot", Cue{Kind: KindHotspot}},
	{".HOTSPOT", Cue{Kind: KindHotspot}},
}

var ordinary = []string{
	"", "data", ".git", ".bashrc", ".", "..", "...", ".Sitex", ".MaxTimeout=3",
	"Site=x", "Hotspot", ".=x", ".Site x", "..Site=x", ".Hot spot",
	".\u212AeepTogether", // Kelvin sign: Unicode-folds to 'K' but is not a cue
}

var malformed = []string{
	".MaxTime=abc", ".MaxTime=0", ".MaxTime=-1", ".MaxTime", ".MaxTime=",
	".MaxTime=+5", ".MaxTime=1.5", ".MaxTime=99999999999999999999",
	".MaxTime=9223372036855", // overflows time.Duration in ms
	".RepLevel=0", ".RepLevel=x", ".RepLevel=65", ".RepLevel=1e3", ".RepLevel",
	".Site=", ".Site", ".Site=a b", ".Site=a,b", ".Site=é", ".Site==x",
	".KeepTogether=1", ".KeepTogether=", ".WholeFile=true", ".Hotspot=",
	".EventualConsistency=yes",
	".RepSites=0", ".RepSites=65", ".SyncLevel=0", ".SyncLevel=65",
}

func TestParseComponent(t *testing.T) {
	for _, tc := range wellFormed {
		c, ok, err := ParseComponent(tc.in)
		if !ok || err != nil || c != tc.want {
			t.Errorf("ParseComponent(%q) = %+v, %v, %v; want %+v, true, nil", tc.in, c, ok, err, tc.want)
		}
		if !IsCue(tc.in) {
			t.Errorf("IsCue(%q) = false", tc.in)
		}
	}
	for _, in := range ordinary {
		c, ok, err := ParseComponent(in)
		if ok || err != nil || c != (Cue{}) {
			t.Errorf("ParseComponent(%q) = %+v, %v, %v; want ordinary name", in, c, ok, err)
		}
		if IsCue(in) {
			t.Errorf("IsCue(%q) = true", in)
		}
	}
	for _, in := range malformed {
		_, ok, err := ParseComponent(in)
		if !ok || !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseComponent(%q) = ok %v, err %v; want ok and ErrMalformed", in, ok, err)
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Component != in || e.Reason == "" {
			t.Errorf("ParseComponent(%q) error %#v does not name the component and reason", in, err)
		}
		if !strings.Contains(err.Error(), in) {
			t.Errorf("error message %q lacks component %q", err, in)
		}
		if !IsCue(in) {
			t.Errorf("IsCue(%q) = false for malformed cue", in)
		}
	}
}

func TestCueString(t *testing.T) {
	for _, tc := range wellFormed {
		c, _, _ := ParseComponent(tc.want.String())
		if c != tc.want {
			t.Errorf("%q: String %q reparses to %+v", tc.in, tc.want.String(), c)
		}
	}
	if got := (Cue{Kind: KindMaxTime, D: 1500 * ms}).String(); got != ".MaxTime=1500" {
		t.Errorf("MaxTime String = %q", got)
	}
}

func TestKind(t *testing.T) {
	persistent := map[Kind]bool{KindSite: true, KindKeepTogether: true, KindRepSites: true,
		KindRepLevel: true, KindEventualConsistency: true}
	for k := KindSite; k < numKinds; k++ {
		if k.Persistent() != persistent[k] {
			t.Errorf("%v.Persistent() = %v", k, k.Persistent())
		}
		if !IsCue("." + k.String()) {
			t.Errorf("Kind %v name is not a cue", k)
		}
	}
	if KindNone.Persistent() || Kind(99).String() != "Kind(99)" || KindHotspot.String() != "Hotspot" {
		t.Error("KindNone/out-of-range Kind misbehave")
	}
}

func TestSplit(t *testing.T) {
	ec1000 := Set{EventualConsistency: true, MaxTime: 1000 * ms}
	tests := []struct {
		path  string
		comps []Component
		final Set
	}{
		{"", nil, Set{}},
		{"/", nil, Set{}},
		{"a/b", []Component{{"a", Set{}}, {"b", Set{}}}, Set{}},
		{"/wfs/.EventualConsistency/.MaxTime=1000/cache/x",
			[]Component{{"wfs", Set{}}, {"cache", ec1000}, {"x", ec1000}}, ec1000},
		// Cues in the middle apply only after them.
		{"/a/.Hotspot/b/.WholeFile/c", []Component{{"a", Set{}}, {"b", Set{Hotspot: true}},
			{"c", Set{Hotspot: true, WholeFile: true}}}, Set{Hotspot: true, WholeFile: true}},
		// Trailing cues are only in final.
		{"/dir/file/.RepLevel=2/.Site=x", []Component{{"dir", Set{}}, {"file", Set{}}},
			Set{RepLevel: 2, Site: "x", HasSite: true}},
		{".KeepTogether", nil, Set{KeepTogether: true}},
		// Dot-names and empty components.
		{"//.git//.Site=x/./..//.bashrc/", []Component{{".git", Set{}},
			{".", Set{Site: "x", HasSite: true}}, {"..", Set{Site: "x", HasSite: true}},
			{".bashrc", Set{Site: "x", HasSite: true}}}, Set{Site: "x", HasSite: true}},
		// Later cues of the same name override earlier ones.
		{"/.MaxTime=1/a/.MaxTime=2/b", []Component{{"a", Set{MaxTime: ms}}, {"b", Set{MaxTime: 2 * ms}}},
			Set{MaxTime: 2 * ms}},
		{"/.Site=a/.site=B/.Site=Random/f", []Component{{"f", Set{Site: "random", HasSite: true}}},
			Set{Site: "random", HasSite: true}},
		{"/.RepLevel=5/.SyncLevel=4/.RepLevel=4/f", []Component{{"f", Set{RepLevel: 4, SyncLevel: 4}}},
			Set{RepLevel: 4, SyncLevel: 4}},
		{"/.RepSites=1/.RepSites=2/.EventualConsistency/.eventualconsistency/f",
			[]Component{{"f", Set{RepSites: 2, EventualConsistency: true}}},
			Set{RepSites: 2, EventualConsistency: true}},
		// Combination check only at the end here, so ordering among cues is free.
		{"/a/.SyncLevel=5/.RepLevel=5", []Component{{"a", Set{}}}, Set{SyncLevel: 5, RepLevel: 5}},
	}
	for _, tc := range tests {
		comps, final, err := Split(tc.path)
		if err != nil || !reflect.DeepEqual(comps, tc.comps) || final != tc.final {
			t.Errorf("Split(%q) = %+v, %+v, %v\nwant %+v, %+v", tc.path, comps, final, err, tc.comps, tc.final)
		}
	}
}

var badPaths = []struct{ path, component string }{
	{"/a/.MaxTime=abc/b", ".MaxTime=abc"},
	{"/a/.RepLevel=0", ".RepLevel=0"},
	{"/.SyncLevel=4/x", ".SyncLevel=4"},
	{"/.synclevel=04/.RepLevel=3/x", ".synclevel=04"},
	{"/.RepSites=4/x", ".RepSites=4"},
	{"/.RepLevel=2/.RepSites=3", ".RepSites=3"},
	{"/.RepLevel=5/.SyncLevel=5/a/.RepLevel=2/b", ".SyncLevel=5"},
	// Set in force at a is invalid even though the final one is not.
	{"/.SyncLevel=5/a/.RepLevel=5/b", ".SyncLevel=5"},
}

func TestSplitErrors(t *testing.T) {
	for _, tc := range badPaths {
		comps, final, err := Split(tc.path)
		var e *Error
		if !errors.Is(err, ErrMalformed) || !errors.As(err, &e) || e.Component != tc.component {
			t.Errorf("Split(%q) err = %v; want *Error naming %q", tc.path, err, tc.component)
		}
		if comps != nil || !final.IsZero() {
			t.Errorf("Split(%q) returned %v, %v with error", tc.path, comps, final)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		s  Set
		ok bool
	}{
		{Set{}, true},
		{Set{SyncLevel: 3}, true},
		{Set{SyncLevel: 4}, false}, // default RepLevel 3
		{Set{SyncLevel: 1, RepLevel: 1}, true},
		{Set{SyncLevel: 2, RepLevel: 1}, false},
		{Set{SyncLevel: 64, RepLevel: 64}, true},
		{Set{RepSites: 3}, true},
		{Set{RepSites: 4}, false},
		{Set{RepSites: 2, RepLevel: 1}, false},
		{Set{RepSites: 5, RepLevel: 5}, true},
		{Set{RepLevel: 65}, false},
		{Set{RepLevel: -1}, false},
		{Set{Site: "x"}, false},     // Site without HasSite
		{Set{HasSite: true}, false}, // HasSite without Site
		{Set{Site: "a/b", HasSite: true}, false},
		{Set{MaxTime: -ms}, false},
		{Set{MaxTime: 1500 * time.Microsecond}, false},
		{Set{MaxTime: time.Hour, Hotspot: true, WholeFile: true}, true},
	}
	for _, tc := range tests {
		err := tc.s.Validate()
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrMalformed) {
			t.Errorf("%+v.Validate() = %v; want ok=%v", tc.s, err, tc.ok)
		}
	}
}

func TestEffective(t *testing.T) {
	tests := []struct {
		s        Set
		rep, syn int
	}{
		{Set{}, DefaultRepLevel, DefaultRepLevel},
		{Set{RepLevel: 5}, 5, 5},
		{Set{SyncLevel: 2}, 3, 2},
		{Set{RepLevel: 1, SyncLevel: 1}, 1, 1},
	}
	for _, tc := range tests {
		if r, s := tc.s.EffectiveRepLevel(), tc.s.EffectiveSyncLevel(); r != tc.rep || s != tc.syn {
			t.Errorf("%+v: effective rep %d sync %d; want %d %d", tc.s, r, s, tc.rep, tc.syn)
		}
	}
}

var all = Set{Site: "rice.edu", HasSite: true, KeepTogether: true, RepSites: 2, RepLevel: 4,
	SyncLevel: 2, EventualConsistency: true, MaxTime: 1000 * ms, WholeFile: true, Hotspot: true}

func TestKeyString(t *testing.T) {
	tests := []struct {
		s        Set
		key, str string
	}{
		{Set{}, "", ""},
		{Set{EventualConsistency: true, MaxTime: 1000 * ms},
			"EventualConsistency,MaxTime=1000", "/.EventualConsistency/.MaxTime=1000"},
		{Set{Hotspot: true, Site: "random", HasSite: true}, "Site=random,Hotspot", "/.Site=random/.Hotspot"},
		{all, "Site=rice.edu,KeepTogether,RepSites=2,RepLevel=4,SyncLevel=2,EventualConsistency,MaxTime=1000,WholeFile,Hotspot",
			"/.Site=rice.edu/.KeepTogether/.RepSites=2/.RepLevel=4/.SyncLevel=2/.EventualConsistency/.MaxTime=1000/.WholeFile/.Hotspot"},
	}
	for _, tc := range tests {
		if got := tc.s.Key(); got != tc.key {
			t.Errorf("Key() = %q; want %q", got, tc.key)
		}
		if got := tc.s.String(); got != tc.str {
			t.Errorf("String() = %q; want %q", got, tc.str)
		}
		if got, err := Parse(tc.key); err != nil || got != tc.s {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.key, got, err, tc.s)
		}
		if comps, got, err := Split(tc.str); err != nil || comps != nil || got != tc.s {
			t.Errorf("Split(%q) = %v, %+v, %v; want %+v", tc.str, comps, got, err, tc.s)
		}
		if tc.s.IsZero() != (tc.key == "") {
			t.Errorf("%+v.IsZero() = %v", tc.s, tc.s.IsZero())
		}
	}
	// Different orders and spellings of the same cues give the same Key.
	_, a, _ := Split("/.maxtime=0100/.EVENTUALCONSISTENCY/x")
	_, b, _ := Split("/.EventualConsistency/x/.MaxTime=100")
	if a.Key() != b.Key() || a.Key() != "EventualConsistency,MaxTime=100" {
		t.Errorf("keys differ: %q vs %q", a.Key(), b.Key())
	}
}

func TestParseErrors(t *testing.T) {
	for _, key := range []string{",", "Bogus", "RepLevel=1,", ".RepLevel=1", "Site=", "MaxTime=0",
		"KeepTogether=1", "Hotspot,git"} {
		if _, err := Parse(key); !errors.Is(err, ErrMalformed) {
			t.Errorf("Parse(%q) err = %v; want ErrMalformed", key, err)
		}
	}
}

func TestPersistentAndMap(t *testing.T) {
	p := all.Persistent()
	want := Set{Site: "rice.edu", HasSite: true, KeepTogether: true, RepSites: 2, RepLevel: 4,
		EventualConsistency: true}
	if p != want {
		t.Errorf("Persistent() = %+v; want %+v", p, want)
	}
	for _, c := range all.Cues() {
		if c.Kind.Persistent() != (p.Apply(c) == p) {
			t.Errorf("Kind %v persistence disagrees with Set.Persistent", c.Kind)
		}
	}
	got, _ := json.Marshal(Set{RepLevel: 2, Site: "x", HasSite: true, MaxTime: 1000 * ms, Hotspot: true}.Map())
	if string(got) != `{"Hotspot":true,"MaxTime":1000,"RepLevel":2,"Site":"x"}` {
		t.Errorf("Map JSON = %s", got)
	}
	if m := (Set{}).Map(); m == nil || len(m) != 0 {
		t.Errorf("empty Map = %#v", m)
	}
}

func FuzzParse(f *testing.F) {
	for _, tc := range wellFormed {
		f.Add(tc.in)
		f.Add("/a/" + tc.in + "/b")
	}
	for _, s := range append(ordinary, malformed...) {
		f.Add(s)
	}
	for _, tc := range badPaths {
		f.Add(tc.path)
	}
	f.Add(all.String())
	f.Add(all.Key())
	f.Fuzz(func(t *testing.T, in string) {
		for _, comp := range strings.Split(in, "/") {
			c, ok, err := ParseComponent(comp)
			if ok != IsCue(comp) {
				t.Fatalf("ParseComponent(%q) ok=%v but IsCue=%v", comp, ok, IsCue(comp))
			}
			if !ok && (err != nil || c != (Cue{})) {
				t.Fatalf("ordinary %q: %+v, %v", comp, c, err)
			}
			if err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("ParseComponent(%q) error %v is not ErrMalformed", comp, err)
			}
			if ok && err == nil {
				if c2, _, err := ParseComponent(c.String()); err != nil || c2 != c {
					t.Fatalf("cue %q: String %q reparses to %+v, %v", comp, c.String(), c2, err)
				}
			}
		}
		comps, final, err := Split(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Split(%q) error %v is not ErrMalformed", in, err)
			}
		} else {
			if err := final.Validate(); err != nil {
				t.Fatalf("Split(%q) final %+v invalid: %v", in, final, err)
			}
			for _, c := range comps {
				if c.Name == "" || strings.Contains(c.Name, "/") || IsCue(c.Name) || c.Cues.Validate() != nil {
					t.Fatalf("Split(%q) bad component %+v", in, c)
				}
			}
			checkRoundTrip(t, final)
		}
		if s, err := Parse(in); err == nil {
			_ = s.Validate()
			checkRoundTrip(t, s)
		} else if !errors.Is(err, ErrMalformed) {
			t.Fatalf("Parse(%q) error %v is not ErrMalformed", in, err)
		}
	})
}

func checkRoundTrip(t *testing.T, s Set) {
	t.Helper()
	if got, err := Parse(s.Key()); err != nil || got != s {
		t.Fatalf("Parse(Key %q) = %+v, %v; want %+v", s.Key(), got, err, s)
	}
	if s.Validate() != nil {
		return // Split validates; Parse need not
	}
	if comps, got, err := Split(s.String()); err != nil || comps != nil || got != s {
		t.Fatalf("Split(String %q) = %v, %+v, %v; want %+v", s.String(), comps, got, err, s)
	}
}
