package fusefs

import (
	"testing"
	"time"

	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/oid"
)

func TestInodeNumbers(t *testing.T) {
	id := oid.Make(7, 42)
	if got := inode(id, cue.Set{}); got != uint64(id) {
		t.Fatalf("plain view inode = %d, want the object ID %d", got, id)
	}
	ec := cue.Set{EventualConsistency: true}
	mt := cue.Set{MaxTime: time.Second}
	both := cue.Set{EventualConsistency: true, MaxTime: time.Second}
	seen := map[uint64]string{uint64(id): "plain"}
	for name, s := range map[string]cue.Set{"ec": ec, "maxtime": mt, "both": both} {
		a, b := inode(id, s), inode(id, s)
		if a != b {
			t.Fatalf("%s: inode not deterministic", name)
		}
		if prev, dup := seen[a]; dup {
			t.Fatalf("%s: inode %d collides with %s", name, a, prev)
		}
		seen[a] = name
	}
	// Cue order in the path does not matter: the set is canonical.
	if inode(id, ec.Apply(cue.Cue{Kind: cue.KindMaxTime, D: time.Second})) != inode(id, both) {
		t.Fatal("same cue set, different inode")
	}
}
