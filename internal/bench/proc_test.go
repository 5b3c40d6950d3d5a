package bench

import (
	"strings"
	"testing"
)

func TestLineWatcher(t *testing.T) {
	var log strings.Builder
	lw := newLineWatcher(&log, readyPrefix)
	for _, part := range []string{"noise\nWheelFS mou", "nted at /m (data in /d).\n", "later\n"} {
		lw.Write([]byte(part))
	}
	select {
	case line := <-lw.ready:
		if line != "WheelFS mounted at /m (data in /d)." {
			t.Errorf("ready line %q", line)
		}
	default:
		t.Fatal("ready not signalled")
	}
	if log.String() != "noise\nWheelFS mounted at /m (data in /d).\nlater\n" {
		t.Errorf("log copy %q", log.String())
	}
}

func TestRandomDataDoesNotRepeat(t *testing.T) {
	d := randomData(4 << 20)
	seen := map[string]bool{}
	for off := 0; off < len(d); off += 4096 {
		k := string(d[off : off+4096])
		if seen[k] {
			t.Fatalf("4 KiB block at %d repeats", off)
		}
		seen[k] = true
	}
}
