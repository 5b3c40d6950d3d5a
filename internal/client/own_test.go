package client

import (
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
	if got := names(c.list); !slices.Equal(got, []string{"a", "b", "c"}) {
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
	if got := names(c.list); !slices.Equal(got, []string{"b", "c"}) {
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
