package server

import (
	"fmt"
	"testing"

	"github.com/wheelfs/wheelfs/internal/oid"
)

func TestKeysAsFmt(t *testing.T) {
	for _, v := range []uint64{0, 1, 0xabc, 1 << 63, ^uint64(0)} {
		if got, want := hexKey("p/", v, "/s"), fmt.Sprintf("p/%016x/s", v); got != want {
			t.Errorf("hexKey(%#x) = %q, want %q", v, got, want)
		}
		if got, want := posKey(oid.Slice(v)), fmt.Sprintf("repl/%08x", uint32(v)); got != want {
			t.Errorf("posKey(%#x) = %q, want %q", v, got, want)
		}
	}
	if got, want := nameKey(0x1234, "n"), fmt.Sprintf("%016x/%s", 0x1234, "n"); got != want {
		t.Errorf("nameKey = %q, want %q", got, want)
	}
	if got, want := opKey(7, 9), fmt.Sprintf("%s%016x/%016x", opPrefix, 7, 9); got != want {
		t.Errorf("opKey = %q, want %q", got, want)
	}
	if got, want := tombKey("n", 5), fmt.Sprintf("%s%016x/%016x", tombPrefix, nameHash("n"), 5); got != want {
		t.Errorf("tombKey = %q, want %q", got, want)
	}
}
