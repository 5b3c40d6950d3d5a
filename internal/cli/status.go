package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/netcoord"
	"github.com/wheelfs/wheelfs/internal/pki"
)

func newStatus(g *globalFlags) *cobra.Command {
	var data, config, etcd, caDir, nodeDir string
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status [--config HOST:PORT] [--json]",
		Short: "Show a deployment's sites, servers, config members and slices with their health",
		Long: `Show a deployment's sites, servers, configuration-service members and slices.

Credentials come from --node-dir, from --ca (an in-memory certificate of the
configuration service's administrator is made for the query), or from the data directory of a host on this machine (--data,
default the 'wheelfs up' data directory). Without --config, the endpoints of
the config member in --data are used.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				data = defaultDataDir()
			}
			creds, cleanup, err := statusCredentials(data, caDir, nodeDir)
			if err != nil {
				return err
			}
			defer cleanup()
			warnExpiry(os.Stderr, creds, time.Now())
			endpoints, err := configEndpoints(data, config, etcd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			conf, err := configsvc.Dial(ctx, endpoints, creds.ClientTLS(""),
				configsvc.Options{Logger: g.logger(), RPCTimeout: timeout, OneShot: true})
			if err != nil {
				return err
			}
			defer conf.Close()
			var t *configsvc.Table
			var members []configsvc.Member
			var known map[string]configsvc.ServerInfo
			var coords map[string]configsvc.NodeCoord
			// A leader election (members joining) fails reads for a moment.
			if err := retryUntil(ctx, func() (err error) {
				if t, err = conf.Table(ctx); err != nil {
					return err
				}
				if members, err = conf.Members(ctx); err != nil {
					return err
				}
				if known, err = conf.KnownServers(ctx); err != nil {
					return err
				}
				coords, err = conf.Coords(ctx)
				return err
			}); err != nil {
				return err
			}
			st := buildStatus(t, members, known)
			addCoords(&st, coords)
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			return renderStatus(os.Stdout, st)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&data, "data", "", "data `DIR` of a host on this machine (credentials, and endpoints without --config)")
	fl.StringVar(&config, "config", "", "configuration service: comma-separated HOST:PORT of config members")
	fl.StringVar(&etcd, "etcd", "", "endpoints of an existing etcd (instead of --config)")
	fl.StringVar(&caDir, "ca", "", "deployment CA `DIR`: act as the configuration service's administrator with an in-memory certificate from it")
	fl.StringVar(&nodeDir, "node-dir", "", "node credentials `DIR` to authenticate with")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	fl.DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	return cmd
}

// retryUntil runs f until it succeeds or ctx ends, returning f's last error.
func retryUntil(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// warnExpiry warns when the node certificate status runs with (a host's
// on this machine, or --node-dir) is due for renewal: a node without the
// CA key cannot renew it itself.
func warnExpiry(w io.Writer, creds *pki.Credentials, now time.Time) {
	leaf := creds.Cert.Leaf
	if leaf == nil || !pki.RenewDue(leaf, now) {
		return
	}
	verb := "expires"
	if now.After(leaf.NotAfter) {
		verb = "expired"
	}
	fmt.Fprintf(w, "warning: the certificate of node %q %s %s; re-issue it with 'wheelfs ca issue --renew' (a node holding the CA key renews its own)\n",
		creds.Name, verb, leaf.NotAfter.UTC().Format(time.RFC3339))
}

// statusCredentials loads the credentials status authenticates with.
func statusCredentials(data, caDir, nodeDir string) (*pki.Credentials, func(), error) {
	none := func() {}
	switch {
	case nodeDir != "":
		c, err := pki.LoadCredentials(nodeDir)
		return c, none, err
	case caDir != "":
		// The configuration service's administrator, in memory: what
		// the CA key's holder is anyway, and the name etcd accepts when
		// its authentication is on.
		ca, err := pki.LoadCA(caDir)
		if err != nil {
			return nil, none, err
		}
		c, err := ca.RootCredentials()
		return c, none, err
	}
	c, err := pki.LoadCredentials(filepath.Join(data, "node"))
	if err != nil {
		return nil, none, fmt.Errorf("credentials: %w (give --ca, --node-dir, or --data of a host on this machine)", err)
	}
	return c, none, nil
}

// status is what `wheelfs status` shows (and prints with --json).
type status struct {
	Revision int64              `json:"revision"`
	Sites    []siteStatus       `json:"sites"`
	Servers  []serverStatus     `json:"servers"`
	Members  []configsvc.Member `json:"members"`
	Slices   []sliceStatus      `json:"slices"`
	// Coords are the published network coordinates of servers and
	// clients; RTT is the estimated round trip between sites from them.
	Coords []coordStatus `json:"coords,omitempty"`
	RTT    []siteRTT     `json:"rtt,omitempty"`
}

type coordStatus struct {
	ID      string  `json:"id"`
	Site    string  `json:"site"`
	Role    string  `json:"role"`  // "server" or "client"
	Error   float64 `json:"error"` // Vivaldi's relative error estimate
	Samples uint64  `json:"samples"`
}

// siteRTT is the median estimated RTT over every pair of nodes at sites
// A and B (A ≤ B; A = B: between distinct nodes of one site).
type siteRTT struct {
	A        string  `json:"a"`
	B        string  `json:"b"`
	MedianMs float64 `json:"median_ms"`
	Pairs    int     `json:"pairs"`
}

type siteStatus struct {
	Name    string `json:"name"`
	Servers int    `json:"servers"` // known servers at the site
	Up      int    `json:"up"`      // of which registered
}

type serverStatus struct {
	ID      string `json:"id"`
	Site    string `json:"site,omitempty"` // "" when down (unknown)
	Addr    string `json:"addr,omitempty"`
	Up      bool   `json:"up"`
	Primary int    `json:"primary"` // slices held as primary
	Backup  int    `json:"backup"`  // slices held as backup
	// Free and Total are the bytes free and the size of the file system of
	// the server's data directory, as it last published them (absent when
	// unknown); Full: below its reserve, so it gets no new data.
	Free  int64 `json:"free_bytes,omitempty"`
	Total int64 `json:"total_bytes,omitempty"`
	Full  bool  `json:"full,omitempty"`
}

type sliceStatus struct {
	Slice    uint32           `json:"slice"`
	Policy   configsvc.Policy `json:"policy"`
	Replicas []string         `json:"replicas"`
	Holder   string           `json:"holder"`
	Epoch    int64            `json:"epoch"`
	Health   configsvc.Health `json:"health"`
	// State summarizes Health: "ok", or some of "under-replicated",
	// "misplaced", "unlocked".
	State []string `json:"state"`
}

// buildStatus derives the status report from a table snapshot: servers
// are up when registered, down when only named in some replica list or
// known (registered before) but not registered now.
func buildStatus(t *configsvc.Table, members []configsvc.Member, known map[string]configsvc.ServerInfo) status {
	out := status{Revision: t.Revision, Sites: []siteStatus{}, Servers: []serverStatus{},
		Members: members, Slices: []sliceStatus{}}
	if out.Members == nil {
		out.Members = []configsvc.Member{}
	}
	servers := map[string]*serverStatus{}
	for id, info := range t.Servers {
		servers[id] = &serverStatus{ID: id, Site: info.Site, Addr: info.Addr, Up: true,
			Free: info.Free, Total: info.Total, Full: info.Full}
	}
	for id, info := range known { // registered once, not now: down
		if servers[id] == nil {
			servers[id] = &serverStatus{ID: id, Site: info.Site, Addr: info.Addr}
		}
	}
	for id, s := range t.Slices {
		for i, r := range s.Replicas {
			sv := servers[r]
			if sv == nil {
				sv = &serverStatus{ID: r}
				servers[r] = sv
			}
			if i == 0 {
				sv.Primary++
			} else {
				sv.Backup++
			}
		}
		h := configsvc.Check(t, s)
		st := sliceStatus{Slice: uint32(id), Policy: s.Policy, Replicas: s.Replicas, Holder: s.Holder,
			Epoch: s.Epoch, Health: h}
		if st.Replicas == nil {
			st.Replicas = []string{}
		}
		if h.UnderReplicated {
			st.State = append(st.State, "under-replicated")
		}
		if h.Misplaced {
			st.State = append(st.State, "misplaced")
		}
		if s.Holder == "" {
			st.State = append(st.State, "unlocked")
		}
		if n := len(t.Servers); s.Policy.RepLevel > n {
			st.State = append(st.State, fmt.Sprintf("policy-unmet(RepLevel %d > %d servers)", s.Policy.RepLevel, n))
		}
		if n := registeredSites(t); s.Policy.RepSites > n {
			st.State = append(st.State, fmt.Sprintf("policy-unmet(RepSites %d > %d sites)", s.Policy.RepSites, n))
		}
		if len(st.State) == 0 {
			st.State = []string{"ok"}
		}
		out.Slices = append(out.Slices, st)
	}
	slices.SortFunc(out.Slices, func(a, b sliceStatus) int { return cmp.Compare(a.Slice, b.Slice) })
	sites := map[string]*siteStatus{}
	for _, sv := range servers {
		out.Servers = append(out.Servers, *sv)
		if sv.Site == "" {
			continue
		}
		s := sites[sv.Site]
		if s == nil {
			s = &siteStatus{Name: sv.Site}
			sites[sv.Site] = s
		}
		s.Servers++
		if sv.Up {
			s.Up++
		}
	}
	slices.SortFunc(out.Servers, func(a, b serverStatus) int {
		return cmp.Or(cmp.Compare(a.Site, b.Site), strings.Compare(a.ID, b.ID))
	})
	for _, s := range sites {
		out.Sites = append(out.Sites, *s)
	}
	slices.SortFunc(out.Sites, func(a, b siteStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// addCoords adds the published coordinates and the site RTT matrix.
func addCoords(st *status, coords map[string]configsvc.NodeCoord) {
	st.Coords, st.RTT = []coordStatus{}, []siteRTT{}
	ids := slices.Sorted(maps.Keys(coords))
	for _, id := range ids {
		c := coords[id]
		role := "client"
		if c.Server {
			role = "server"
		}
		st.Coords = append(st.Coords, coordStatus{ID: id, Site: c.Site, Role: role, Error: c.Coord.Error, Samples: c.Samples})
	}
	pairs := map[[2]string][]float64{}
	for i, a := range ids {
		for _, b := range ids[i+1:] {
			ca, cb := coords[a], coords[b]
			d := netcoord.Estimate(ca.Coord, cb.Coord)
			if d == netcoord.Unknown {
				continue
			}
			key := [2]string{min(ca.Site, cb.Site), max(ca.Site, cb.Site)}
			pairs[key] = append(pairs[key], float64(d)/float64(time.Millisecond))
		}
	}
	for key, ms := range pairs {
		slices.Sort(ms)
		med := ms[len(ms)/2]
		if len(ms)%2 == 0 {
			med = (ms[len(ms)/2-1] + ms[len(ms)/2]) / 2
		}
		st.RTT = append(st.RTT, siteRTT{A: key[0], B: key[1], MedianMs: med, Pairs: len(ms)})
	}
	slices.SortFunc(st.RTT, func(x, y siteRTT) int { return cmp.Or(strings.Compare(x.A, y.A), strings.Compare(x.B, y.B)) })
}

// registeredSites counts the sites with a registered server.
func registeredSites(t *configsvc.Table) int {
	sites := map[string]bool{}
	for _, info := range t.Servers {
		sites[info.Site] = true
	}
	return len(sites)
}

// renderStatus prints the report as readable tables.
func renderStatus(w io.Writer, s status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SITE\tSERVERS\tUP")
	for _, st := range s.Sites {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", st.Name, st.Servers, st.Up)
	}
	fmt.Fprintln(tw, "\nSERVER\tSITE\tADDRESS\tSTATE\tFREE\tPRIMARY\tBACKUP")
	for _, sv := range s.Servers {
		state := "up"
		switch {
		case !sv.Up:
			state = "down"
		case sv.Full:
			state = "full"
		}
		free := "-"
		if sv.Total > 0 {
			free = approxSize(sv.Free) + "/" + approxSize(sv.Total)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\n", sv.ID, dash(sv.Site), dash(sv.Addr), state, free, sv.Primary, sv.Backup)
	}
	fmt.Fprintln(tw, "\nMEMBER\tCLIENT URLS\tPEER URLS\tROLE")
	for _, m := range s.Members {
		role := "follower"
		switch {
		case m.Leader:
			role = "leader"
		case m.Learner:
			role = "learner"
		case len(m.ClientURLs) == 0:
			role = "not started"
		case !m.Reachable:
			role = "unreachable"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", dash(m.Name), dash(strings.Join(m.ClientURLs, ",")),
			strings.Join(m.PeerURLs, ","), role)
	}
	fmt.Fprintln(tw, "\nSLICE\tSITE\tREPLEVEL\tREPSITES\tREPLICAS\tLIVE\tHOLDER\tEPOCH\tHEALTH")
	for _, sl := range s.Slices {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%s\t%d/%d\t%s\t%d\t%s\n", sl.Slice, dash(sl.Policy.Site), sl.Policy.RepLevel,
			sl.Policy.RepSites, dash(strings.Join(sl.Replicas, ",")), sl.Health.Live, len(sl.Replicas),
			dash(sl.Holder), sl.Epoch, strings.Join(sl.State, ","))
	}
	if len(s.Coords) > 0 {
		fmt.Fprintln(tw, "\nNODE\tSITE\tROLE\tCOORD ERROR\tSAMPLES")
		for _, c := range s.Coords {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%d\n", c.ID, dash(c.Site), c.Role, c.Error, c.Samples)
		}
	}
	if len(s.RTT) > 0 {
		renderRTT(tw, s.RTT)
	}
	return errors.Join(tw.Flush())
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// renderRTT prints the site RTT matrix (estimated, milliseconds).
func renderRTT(w io.Writer, rtts []siteRTT) {
	var sites []string
	ms := map[[2]string]float64{}
	for _, r := range rtts {
		sites = append(sites, r.A, r.B)
		ms[[2]string{r.A, r.B}], ms[[2]string{r.B, r.A}] = r.MedianMs, r.MedianMs
	}
	slices.Sort(sites)
	sites = slices.Compact(sites)
	fmt.Fprintln(w, "\nEST. RTT ms\t"+strings.Join(sites, "\t"))
	for _, a := range sites {
		fmt.Fprint(w, a)
		for _, b := range sites {
			if v, ok := ms[[2]string{a, b}]; ok {
				fmt.Fprintf(w, "\t%.1f", v)
			} else {
				fmt.Fprint(w, "\t-")
			}
		}
		fmt.Fprintln(w)
	}
}

// approxSize renders a byte count with one decimal in the largest binary
// unit it reaches ("1.5GiB", "512.0KiB", "100B").
func approxSize(n int64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	f, i := float64(n)/1024, 0
	for f >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	return fmt.Sprintf("%.1f%s", f, units[i])
}

// configEndpoints returns the configuration service's endpoints: --config
// and --etcd, else those of the config member whose data is in data.
func configEndpoints(data, config, etcd string) ([]string, error) {
	if endpoints := splitList(config + "," + etcd); len(endpoints) > 0 {
		return endpoints, nil
	}
	b, err := os.ReadFile(deploy.EndpointsFile(data))
	if err != nil {
		return nil, fmt.Errorf("no --config given and no config member in %s: %w", data, err)
	}
	return splitList(strings.TrimSpace(string(b))), nil
}
