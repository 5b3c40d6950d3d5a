package client

import (
	"fmt"
	"slices"
	"testing"

	"github.com/wheelfs/wheelfs/internal/wire"
)

func names(list []*wire.Entry) []string {
	var out []string
	for _, e := range list {
		out = append(out, e.Name)
	}
	return out
}

// TestAdoptEntryChange checks how a client applies its own change to a
// directory it caches: exactly when the answer's version is the next one
// (or the one cached, which an answer since brought), never across a gap.
func TestAdoptEntryChange(t *testing.T) {
	read := []*wire.Entry{{Name: "a"}, {Name: "c"}}
	c := &cached{meta: &wire.Meta{Version: 4}, list: read, listed: true, sorted: true,
		xattrs: &xattrSet{version: 4, names: []string{"user.x"}}}
	c.setAbsent("b")

	if !adoptEntryChange(c, &wire.Meta{Version: 5}, "b", &wire.Entry{Name: "b"}) {
		t.Fatal("the next version was not adopted")
	}
	if got := names(c.listing()); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("listing %v after adding b", got)
	}
	if names(read)[1] != "c" || len(read) != 2 {
		t.Errorf("the listing the request read was changed in place: %v", names(read))
	}
	if e, known := c.find("b"); !known || e == nil {
		t.Errorf("b is %v (known %v) after its create; the missing-name record must go", e, known)
	}
	if c.meta.Version != 5 || c.xattrs == nil || c.xattrs.version != 5 {
		t.Errorf("meta version %d, xattrs %+v; want 5 with the names kept", c.meta.Version, c.xattrs)
	}

	// The same version again (an answer since brought it): names only.
	if !adoptEntryChange(c, &wire.Meta{Version: 5}, "a", nil) {
		t.Fatal("the cached version was not adopted")
	}
	if e, known := c.find("a"); !known || e != nil {
		t.Errorf("a is %v (known %v) after its removal", e, known)
	}
	if got := names(c.listing()); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("listing %v after removing a", got)
	}

	// A gap (another change came between) or an older answer: refused.
	for _, v := range []uint64{7, 3} {
		if adoptEntryChange(c, &wire.Meta{Version: v}, "z", &wire.Entry{Name: "z"}) {
			t.Errorf("version %d adopted onto 5", v)
		}
	}
	if adoptEntryChange(c, nil, "z", &wire.Entry{Name: "z"}) {
		t.Error("an answer without the directory's meta-data was adopted")
	}

	// An unsorted listing gets the name appended.
	u := &cached{meta: &wire.Meta{Version: 1}, list: []*wire.Entry{{Name: "y"}, {Name: "x"}}, listed: true}
	if !adoptEntryChange(u, &wire.Meta{Version: 2}, "a", &wire.Entry{Name: "a"}) ||
		!slices.Equal(names(u.list), []string{"y", "x", "a"}) {
		t.Errorf("unsorted listing %v", names(u.list))
	}
}

// TestAdoptListedMany: a sorted listing that many own creates and
// unlinks change answers every name right before and after the changes
// are merged, and the request that read it keeps what it read.
func TestAdoptListedMany(t *testing.T) {
	var read []*wire.Entry
	for i := range 1000 {
		read = append(read, &wire.Entry{Name: fmt.Sprintf("f%04d", 2*i)}) // even names
	}
	c := &cached{list: read, listed: true, sorted: true}
	want := map[string]bool{}
	for _, e := range read {
		want[e.Name] = true
	}
	check := func(step int) {
		t.Helper()
		for i := range 2001 {
			name := fmt.Sprintf("f%04d", i)
			if e, known := c.find(name); !known || (e != nil) != want[name] || e != nil && e.Name != name {
				t.Fatalf("step %d: %s is %v (known %v), want present %v", step, name, e, known, want[name])
			}
		}
	}
	for i := range 1000 {
		// Remove the even names from the front (rm of a listed directory),
		// create the odd ones from the back.
		gone, added := fmt.Sprintf("f%04d", 2*i), fmt.Sprintf("f%04d", 1999-2*i)
		c.adoptListed(gone, nil)
		c.adoptListed(added, &wire.Entry{Name: added})
		want[gone], want[added] = false, true
		if i%97 == 0 {
			check(i)
		}
	}
	check(1000)
	var wantNames []string
	for i := range 1000 {
		wantNames = append(wantNames, fmt.Sprintf("f%04d", 2*i+1))
	}
	if got := names(c.listing()); !slices.Equal(got, wantNames) {
		t.Errorf("listing after the changes: %d names, first %v", len(got), got[:min(3, len(got))])
	}
	if len(read) != 1000 || read[0].Name != "f0000" || read[999].Name != "f1998" {
		t.Error("the listing the request read was changed")
	}
}

// TestAdoptMeta checks a setattr's or commit's meta-data adoption.
func TestAdoptMeta(t *testing.T) {
	c := &cached{meta: &wire.Meta{Version: 2, Mode: 0o644}, xattrs: &xattrSet{version: 2}}
	if !adoptMeta(c, &wire.Meta{Version: 3, Mode: 0o600}) || c.meta.Mode != 0o600 || c.xattrs != nil {
		t.Errorf("after adopting version 3: %+v, xattrs %v", c.meta, c.xattrs)
	}
	if adoptMeta(c, &wire.Meta{Version: 5}) || adoptMeta(c, &wire.Meta{Version: 2}) {
		t.Error("a gap or an older version was adopted")
	}
}
