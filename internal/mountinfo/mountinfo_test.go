package mountinfo

import "testing"

const sampleMountinfo = `22 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
30 22 0:26 / /proc rw - proc proc rw
42 27 0:39 / /var/tmp/b/wheelfs-mnt rw,nosuid,nodev,relatime - fuse.wheelfs wheelfs rw,user_id=0
43 22 0:40 / /var/tmp/with\040space rw shared:5 master:1 - fuse.loopback /var/tmp/back\040dir rw
`

func TestParse(t *testing.T) {
	ms := Parse(sampleMountinfo)
	if len(ms) != 4 {
		t.Fatalf("got %d entries: %+v", len(ms), ms)
	}
	if ms[2].Point != "/var/tmp/b/wheelfs-mnt" || ms[2].FSType != "fuse.wheelfs" {
		t.Errorf("entry 2: %+v", ms[2])
	}
	if ms[3].Point != "/var/tmp/with space" || ms[3].Source != "/var/tmp/back dir" || ms[3].FSType != "fuse.loopback" {
		t.Errorf("optional fields or escapes: %+v", ms[3])
	}
	if e, ok := Of(ms, "/var/tmp/wheelfs-bench-1"); !ok || e.Point != "/" || e.Source != "/dev/vda" {
		t.Errorf("Of = %+v, %v", e, ok)
	}
	if e, ok := Of(ms, "/var/tmp/b/wheelfs-mnt/x"); !ok || e.FSType != "fuse.wheelfs" {
		t.Errorf("Of inside mount = %+v, %v", e, ok)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`a\040b`: "a b", `tab\011`: "tab\t", `back\134slash`: `back\slash`, `plain`: "plain", `end\04`: `end\04`} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
