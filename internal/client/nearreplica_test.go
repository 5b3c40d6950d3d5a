package client

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// TestNearGrants: a kept grant is shown only for its file, its user and
// blocks it names, while more than nearGrantMargin of it is left.
func TestNearGrants(t *testing.T) {
	h := func(b byte) [32]byte { return [32]byte{b} }
	grant := func(uid uint32, expires time.Time, hs ...[32]byte) *wire.Grant {
		b := &wire.GrantBody{Id: 7, Uid: uid, ExpiresUnixMs: expires.UnixMilli()}
		for _, x := range hs {
			b.Hashes = append(b.Hashes, x[:])
		}
		body, err := proto.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		return &wire.Grant{Body: body}
	}
	var n nearGrants
	live := grant(1000, time.Now().Add(time.Minute), h(1), h(2), h(3))
	n.add(oid.ID(7), live)
	n.add(oid.ID(7), grant(1000, time.Now().Add(nearGrantMargin/2), h(4)))
	for _, c := range []struct {
		id     oid.ID
		uid    uint32
		hashes [][32]byte
		want   *wire.Grant
	}{
		{7, 1000, [][32]byte{h(1), h(3)}, live},
		{7, 1000, [][32]byte{h(1), h(4)}, nil}, // 4 is in a grant about to expire
		{7, 1000, [][32]byte{h(4)}, nil},
		{7, 1001, [][32]byte{h(1)}, nil}, // another user
		{8, 1000, [][32]byte{h(1)}, nil}, // another file
	} {
		if got := n.forFile(c.id, c.uid, c.hashes); got != c.want {
			t.Errorf("forFile(%v, %d, %d hashes) = %v, want %v", c.id, c.uid, len(c.hashes), got != nil, c.want != nil)
		}
	}
}
