package testbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"
)

// Role is what a testbed host runs.
type Role string

const (
	// RoleConfig runs one member of the configuration service.
	RoleConfig Role = "config"
	// RoleNode runs a storage server and a FUSE mount (`wheelfs node`).
	RoleNode Role = "node"
	// RoleClient runs a FUSE mount only (`wheelfs mount`).
	RoleClient Role = "client"
)

// Ports every host uses inside its own network namespace.
const (
	configPort = 7001 // config member client port (peer port +1)
	serverPort = 7101
	peerPort   = 7201 // a client's cache served to other clients (.Hotspot)
)

// maxMembers is the largest configuration service the testbed starts: one
// member per site, at most five (etcd gains nothing beyond).
const maxMembers = 5

// Options describe a testbed to bring up.
type Options struct {
	Sites          []string      `json:"sites"`
	RTT            RTTMatrix     `json:"rtt"`
	Uplink         uint64        `json:"uplink_bps"` // per-site egress rate, bits/s; 0 = unlimited
	ServersPerSite int           `json:"servers_per_site"`
	ClientsPerSite int           `json:"clients_per_site"`
	LockTTL        time.Duration `json:"lock_ttl"`
	Maintain       time.Duration `json:"maintain_period"`
	Lease          time.Duration `json:"lease"`
	// TCPCongestion is the congestion control of the hosts' wide-area
	// routes ("" keeps the kernel's default). The default is cubic, Linux's
	// own default: with BBR, which some machines use, an application-limited
	// RPC connection is paced at its low bandwidth estimate, and a 64 KiB
	// round over 100 ms took 150 ms instead of 100 ms.
	TCPCongestion string `json:"tcp_congestion"`
	// NoSlowStartAfterIdle sets net.ipv4.tcp_slow_start_after_idle=0 in
	// the hosts' namespaces: a connection idle for more than its RTO then
	// keeps its congestion window instead of starting over from the
	// initial window (RFC 2861's restart, Linux's default).
	NoSlowStartAfterIdle bool `json:"no_slow_start_after_idle,omitempty"`
	// Binary is the wheelfs executable the hosts run (default: this one).
	Binary string `json:"binary"`
	// LogLevel is the hosts' --log-level ("" keeps their default, info);
	// debug shows, e.g., where each .Hotspot block came from.
	LogLevel string `json:"log_level,omitempty"`
}

var siteName = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

// Validate checks the options and fills in defaults.
func (o *Options) Validate() error {
	if len(o.Sites) < 1 || len(o.Sites) > 50 {
		return fmt.Errorf("--sites: want 1 to 50 sites, got %d", len(o.Sites))
	}
	seen := map[string]bool{}
	for _, s := range o.Sites {
		if !siteName.MatchString(s) {
			return fmt.Errorf("--sites: site name %q: want a lower-case letter then up to 7 letters or digits", s)
		}
		if seen[s] {
			return fmt.Errorf("--sites: site %q given twice", s)
		}
		seen[s] = true
	}
	if o.ServersPerSite < 0 || o.ClientsPerSite < 0 || o.ServersPerSite+o.ClientsPerSite < 1 || o.ServersPerSite+o.ClientsPerSite > 200 {
		return errors.New("--servers-per-site and --clients-per-site: want 0..200 each and at least one host per site")
	}
	if o.ServersPerSite == 0 && len(o.Sites) > 0 {
		return errors.New("--servers-per-site: want at least one storage server per site")
	}
	if o.RTT == nil {
		o.RTT = RTTMatrix{}
	}
	for k := range o.RTT {
		a, b, _ := strings.Cut(k, ",")
		if !seen[a] || !seen[b] {
			return fmt.Errorf("rtt matrix names unknown site pair %q", k)
		}
	}
	return nil
}

// RTTMatrix maps a site pair "a,b" (in either order) to its round-trip time.
type RTTMatrix map[string]Duration

// Uniform is a matrix with the same RTT between every two distinct sites.
func Uniform(sites []string, rtt time.Duration) RTTMatrix {
	m := RTTMatrix{}
	for i, a := range sites {
		for _, b := range sites[i+1:] {
			m.Set(a, b, rtt)
		}
	}
	return m
}

func pairKey(a, b string) string {
	if a > b {
		a, b = b, a
	}
	return a + "," + b
}

// Set records the RTT between a and b.
func (m RTTMatrix) Set(a, b string, rtt time.Duration) { m[pairKey(a, b)] = Duration(rtt) }

// Get returns the RTT between a and b (0 within a site or when unset).
func (m RTTMatrix) Get(a, b string) time.Duration {
	if a == b {
		return 0
	}
	return time.Duration(m[pairKey(a, b)])
}

// ReadRTTMatrix reads a matrix file: one line per pair, "west east 100ms",
// '#' comments.
func ReadRTTMatrix(path string) (RTTMatrix, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := RTTMatrix{}
	for i, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("%s:%d: want \"SITE SITE RTT\", got %q", path, i+1, line)
		}
		d, err := time.ParseDuration(f[2])
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%s:%d: RTT %q: want a duration such as 100ms", path, i+1, f[2])
		}
		m.Set(f[0], f[1], d)
	}
	return m, nil
}

// Duration is a time.Duration that reads and writes JSON as "100ms".
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// ParseRate reads a rate such as "6mbit", "100kbit", "1gbit" or a plain
// number of bits per second, as tc writes them.
func ParseRate(s string) (uint64, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" || s == "0" {
		return 0, nil
	}
	mult := uint64(1)
	for _, u := range []struct {
		suffix string
		m      uint64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	var v float64
	if _, err := fmt.Sscanf(s, "%g", &v); err != nil || v <= 0 {
		return 0, fmt.Errorf("rate %q: want a number of bits per second such as 6mbit", s)
	}
	return uint64(v * float64(mult)), nil
}

// Host is one process host of the testbed: its own network namespace, one
// address, and the wheelfs process it runs.
type Host struct {
	Name  string   `json:"name"` // west-1, west-c
	Site  string   `json:"site"`
	Role  Role     `json:"role"`
	Addr  string   `json:"addr"`
	NS    string   `json:"netns"`
	Mount string   `json:"mount,omitempty"`
	Data  string   `json:"data"`
	Log   string   `json:"log"`
	Ready string   `json:"ready_file"`
	Args  []string `json:"args"` // without the binary
	PID   int      `json:"pid,omitempty"`
	Start uint64   `json:"start_ticks,omitempty"` // /proc/PID/stat start time, to tell a reused PID
}

// Addressing: site i (0-based) has the host subnet 10.77.(i+1).0/24 behind
// a bridge at .1, and reaches the wide-area router over 10.78.(i+1).0/24.
// Nothing here is routed to the host's own interfaces.
func siteNet(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, byte(i + 1), 0}), 24)
}
func siteGateway(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 77, byte(i + 1), 1}) }
func hostAddr(i, n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 77, byte(i + 1), byte(n)}) }
func wanSiteSide(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 78, byte(i + 1), 1}) }
func wanRouterSide(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 78, byte(i + 1), 2})
}

// siteOf returns the site index of a host address, or -1.
func siteOf(a [4]byte) int {
	if a[0] != 10 || a[1] != 77 || a[2] == 0 {
		return -1
	}
	return int(a[2]) - 1
}

// hostNumber of the config member's host in a site's subnet; storage and
// client hosts are numbered from 11.
const (
	configHostNumber = 5
	firstHostNumber  = 11
)

var netipInvalid netip.Addr

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
