package bench

import (
	"strings"
	"testing"
)

const sampleMountinfo = `22 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
30 22 0:26 / /proc rw - proc proc rw
42 27 0:39 / /var/tmp/b/wheelfs-mnt rw,nosuid,nodev,relatime - fuse.wheelfs wheelfs rw,user_id=0
43 22 0:40 / /var/tmp/with\040space rw shared:5 master:1 - fuse.loopback /var/tmp/back\040dir rw
`

func TestParseMountinfo(t *testing.T) {
	ms := parseMountinfo(sampleMountinfo)
	if len(ms) != 4 {
		t.Fatalf("got %d entries: %+v", len(ms), ms)
	}
	if ms[2].Point != "/var/tmp/b/wheelfs-mnt" || ms[2].FSType != "fuse.wheelfs" {
		t.Errorf("entry 2: %+v", ms[2])
	}
	if ms[3].Point != "/var/tmp/with space" || ms[3].Source != "/var/tmp/back dir" || ms[3].FSType != "fuse.loopback" {
		t.Errorf("optional fields or escapes: %+v", ms[3])
	}
	if e, ok := mountOf(ms, "/var/tmp/wheelfs-bench-1"); !ok || e.Point != "/" || e.Source != "/dev/vda" {
		t.Errorf("mountOf = %+v, %v", e, ok)
	}
	if e, ok := mountOf(ms, "/var/tmp/b/wheelfs-mnt/x"); !ok || e.FSType != "fuse.wheelfs" {
		t.Errorf("mountOf inside mount = %+v, %v", e, ok)
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{`a\040b`: "a b", `tab\011`: "tab\t", `back\134slash`: `back\slash`, `plain`: "plain", `end\04`: `end\04`} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

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
