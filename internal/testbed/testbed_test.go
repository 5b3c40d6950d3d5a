package testbed

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestReadRTTMatrix(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m")
	os.WriteFile(p, []byte("# pairs\nwest east 100ms\neast eu 20ms # comment\n\n"), 0o644)
	m, err := ReadRTTMatrix(p)
	if err != nil {
		t.Fatal(err)
	}
	if m.Get("east", "west") != 100*time.Millisecond || m.Get("eu", "east") != 20*time.Millisecond || m.Get("west", "eu") != 0 || m.Get("west", "west") != 0 {
		t.Errorf("matrix %v", m)
	}
	os.WriteFile(p, []byte("west east\n"), 0o644)
	if _, err := ReadRTTMatrix(p); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Errorf("bad line: err %v, want one naming line 1", err)
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]uint64{"6mbit": 6e6, "100kbit": 1e5, "1gbit": 1e9, "1500": 1500, "0": 0, "": 0, "2.5mbit": 2.5e6} {
		if got, err := ParseRate(in); err != nil || got != want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"fast", "-1mbit", "mbit"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) accepted", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, o := range []Options{
		{Sites: nil, ServersPerSite: 1},
		{Sites: []string{"west", "west"}, ServersPerSite: 1},
		{Sites: []string{"West"}, ServersPerSite: 1},
		{Sites: []string{"west"}, ServersPerSite: 0, ClientsPerSite: 1},
		{Sites: []string{"west"}, ServersPerSite: 1, RTT: RTTMatrix{"west,mars": Duration(time.Second)}},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("Validate(%+v) accepted", o)
		}
	}
}

func TestPlan(t *testing.T) {
	for sites, members := range map[int]int{1: 1, 2: 1, 3: 3, 4: 3, 5: 5, 7: 5} {
		var names []string
		for i := 0; i < sites; i++ {
			names = append(names, string(rune('a'+i))+"site")
		}
		st := plan("/tb", Options{Sites: names, ServersPerSite: 2, ClientsPerSite: 1})
		var cfg, nodes, clients int
		addrs := map[string]bool{}
		for _, h := range st.Hosts {
			switch h.Role {
			case RoleConfig:
				cfg++
			case RoleNode:
				nodes++
			case RoleClient:
				clients++
			}
			if addrs[h.Addr] {
				t.Errorf("address %s given twice", h.Addr)
			}
			addrs[h.Addr] = true
			if !strings.HasPrefix(h.NS, st.Prefix) {
				t.Errorf("host %s namespace %s lacks the prefix", h.Name, h.NS)
			}
		}
		if cfg != members || nodes != 2*sites || clients != sites {
			t.Errorf("%d sites: %d members, %d nodes, %d clients; want %d, %d, %d", sites, cfg, nodes, clients, members, 2*sites, sites)
		}
		if got := len(strings.Split(st.Config, ",")); got != members {
			t.Errorf("%d sites: config %q", sites, st.Config)
		}
	}
	if prefixFor("/a") == prefixFor("/b") {
		t.Error("two directories share a namespace prefix")
	}
}

// ipv4 returns a minimal IPv4 header from host n of site s to host m of
// site d, tagged so that the test can tell packets apart.
func ipv4(s, n, d, m int, tag byte) []byte {
	b := make([]byte, 28)
	b[0] = 0x45
	copy(b[12:16], []byte{10, 77, byte(s + 1), byte(n)})
	copy(b[16:20], []byte{10, 77, byte(d + 1), byte(m)})
	b[27] = tag
	return b
}

// TestRouter runs the delay router over a SOCK_SEQPACKET pair in place of
// the TUN device (one packet per read and write, as TUN): packets are held
// for their pair's one-way delay, kept in order, and dropped while cut.
func TestRouter(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	tun, wire := os.NewFile(uintptr(fds[0]), "tun"), os.NewFile(uintptr(fds[1]), "wire")
	defer wire.Close()
	st := &State{Opts: Options{Sites: []string{"a", "b", "c"}, RTT: RTTMatrix{}}}
	st.Opts.RTT.Set("a", "b", 80*time.Millisecond)
	st.Opts.RTT.Set("b", "c", 0)
	st.Cuts = []string{pairKey("a", "c")}
	r := newRouter(tun, linksOf(st), slog.New(slog.NewTextHandler(io.Discard, nil)))
	done := make(chan error, 1)
	go func() { done <- r.readLoop() }()
	defer func() {
		tun.Close()
		<-done
	}()
	read := func() ([]byte, error) {
		wire.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 2048)
		n, err := wire.Read(b)
		return b[:n], err
	}

	start := time.Now()
	for i := range 50 {
		wire.Write(ipv4(0, 11, 1, 11, byte(i)))
	}
	wire.Write(ipv4(0, 11, 2, 11, 200)) // cut: dropped
	wire.Write(ipv4(1, 11, 2, 11, 201)) // no delay: overtakes the held ones
	first, err := read()
	if err != nil || first[27] != 201 {
		t.Fatalf("first packet out: tag %v, %v; want the undelayed b→c packet", first, err)
	}
	for i := range 50 {
		p, err := read()
		if err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		if p[27] != byte(i) {
			t.Fatalf("packet %d out of order: tag %d", i, p[27])
		}
		if i == 0 {
			if d := time.Since(start); d < 40*time.Millisecond || d > time.Second {
				t.Errorf("a→b packet held %s; want the one-way delay, 40 ms", d)
			}
		}
	}
	wire.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := wire.Read(make([]byte, 2048)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a packet of a cut pair came through (%d bytes, %v)", n, err)
	}
	if r.dropped.Load() != 1 || r.forwarded.Load() != 51 {
		t.Errorf("dropped %d, forwarded %d; want 1 and 51", r.dropped.Load(), r.forwarded.Load())
	}

	// Healing the pair lets its packets through.
	st.Cuts = nil
	r.links.Store(linksOf(st))
	wire.Write(ipv4(2, 11, 0, 11, 202))
	if p, err := read(); err != nil || !bytes.Equal(p[16:20], []byte{10, 77, 1, 11}) {
		t.Errorf("after the heal: %v, %v", p, err)
	}
}
