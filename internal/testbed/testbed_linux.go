package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/wheelfs/wheelfs/internal/mountinfo"
)

// readyTimeout bounds how long up waits for one host to serve.
const readyTimeout = 2 * time.Minute

// Up builds the testbed in dir and starts its processes. On failure it
// leaves the state file, so that Down removes what was made.
func Up(ctx context.Context, dir string, opts Options, out io.Writer) (*State, error) {
	dir, err := absDir(dir)
	if err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("testbed up needs root (network namespaces and FUSE mounts)")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Binary == "" {
		if opts.Binary, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	release, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer release()
	if old, err := Load(dir); err == nil {
		if old.Up {
			return nil, fmt.Errorf("a testbed is already up in %s ('wheelfs testbed down %s' first)", dir, dir)
		}
		fmt.Fprintf(out, "removing what an earlier, interrupted testbed left in %s\n", dir)
		if err := teardown(old, out); err != nil {
			return nil, err
		}
	} else if len(namedNamespaces(prefixFor(dir))) > 0 {
		if err := teardown(&State{Dir: dir, Prefix: prefixFor(dir)}, out); err != nil {
			return nil, err
		}
	}
	// A testbed starts afresh: data of an earlier one is not reused.
	for _, d := range []string{"data", "ca", "run", "logs"} {
		if err := os.RemoveAll(filepath.Join(dir, d)); err != nil {
			return nil, err
		}
	}
	st := plan(dir, opts)
	if err := mkdirs(filepath.Join(dir, "data"), filepath.Join(dir, "run"), filepath.Join(dir, "logs")); err != nil {
		return nil, err
	}
	if err := st.Save(); err != nil {
		return nil, err
	}
	p := &progress{out: out, total: 4 + len(st.Hosts)}
	p.step("certificate authority")
	if b, err := exec.Command(opts.Binary, "ca", "init", st.CA).CombinedOutput(); err != nil {
		return st, fmt.Errorf("wheelfs ca init: %v: %s", err, b)
	}
	p.step(fmt.Sprintf("network: %d sites, %d namespaces", len(opts.Sites), len(st.Namespaces)))
	if err := st.buildNetwork(); err != nil {
		return st, err
	}
	p.step("delay router")
	if err := st.start(&st.Router); err != nil {
		return st, err
	}
	if err := st.waitRouter(ctx); err != nil {
		return st, err
	}
	if err := st.Save(); err != nil {
		return st, err
	}
	p.step("processes")
	// Members first, one at a time (each joins those before it), then the
	// nodes and the clients, which wait for the service themselves, in
	// waves of startWave: hundreds of hosts starting at once on one
	// machine's cores (each with its TLS handshakes to every member)
	// starved the delay router and the members, and the configuration
	// service answered nothing for minutes.
	var wave []*Host
	waitWave := func() error {
		for _, h := range wave {
			if err := h.waitReady(ctx, readyTimeout); err != nil {
				return err
			}
			p.step(fmt.Sprintf("%s ready (%s)", h.Name, h.Mount))
		}
		wave = wave[:0]
		return nil
	}
	for i := range st.Hosts {
		h := &st.Hosts[i]
		if err := st.start(h); err != nil {
			return st, err
		}
		if err := st.Save(); err != nil {
			return st, err
		}
		if h.Role == RoleConfig {
			if err := h.waitReady(ctx, readyTimeout); err != nil {
				return st, err
			}
			p.step(h.Name + " (config member) ready")
			continue
		}
		if wave = append(wave, h); len(wave) == startWave {
			if err := waitWave(); err != nil {
				return st, err
			}
		}
	}
	if err := waitWave(); err != nil {
		return st, err
	}
	st.Up = true
	return st, st.Save()
}

// plan lays out hosts, namespaces and commands.
func plan(dir string, o Options) *State {
	st := &State{Dir: dir, Prefix: prefixFor(dir), Opts: o, CA: filepath.Join(dir, "ca")}
	members := min(len(o.Sites), maxMembers)
	if members%2 == 0 {
		members-- // an even member count tolerates no more failures than one fewer
	}
	var cfg []string
	for i := 0; i < members; i++ {
		cfg = append(cfg, net.JoinHostPort(hostAddr(i, configHostNumber).String(), fmt.Sprint(configPort)))
	}
	st.Config = strings.Join(cfg, ",")
	host := func(site string, i int, name string, role Role, n int) Host {
		h := Host{
			Name: name, Site: site, Role: role, Addr: hostAddr(i, n).String(),
			NS:    st.Prefix + name,
			Data:  filepath.Join(dir, "data", name),
			Log:   filepath.Join(dir, "logs", name+".log"),
			Ready: filepath.Join(dir, "run", name+".ready"),
		}
		common := []string{"--ca", st.CA, "--ready-file", h.Ready, "--data", h.Data}
		if o.LogLevel != "" {
			common = append(common, "--log-level", o.LogLevel)
		}
		switch role {
		case RoleConfig:
			h.Args = append([]string{"config", "--listen", net.JoinHostPort(h.Addr, fmt.Sprint(configPort))}, common...)
			if i > 0 {
				h.Args = append(h.Args, "--peers", strings.Join(cfg[:i], ","))
			}
		case RoleNode:
			h.Mount = filepath.Join(dir, name)
			h.Args = append([]string{"node", "--config", st.Config, "--site", site,
				"--listen", net.JoinHostPort(h.Addr, fmt.Sprint(serverPort)), "--config-wait", "2m",
				"--peer-listen", net.JoinHostPort(h.Addr, fmt.Sprint(peerPort)),
				// Client-only hosts act for the experiments' uids without logins.
				"--trust-client-uids"}, common...)
			if o.LockTTL > 0 {
				h.Args = append(h.Args, "--lock-ttl", o.LockTTL.String())
			}
			if o.Maintain > 0 {
				h.Args = append(h.Args, "--maintain-period", o.Maintain.String())
			}
			if o.Lease != 0 {
				h.Args = append(h.Args, "--lease", o.Lease.String())
			}
			h.Args = append(h.Args, h.Mount)
		case RoleClient:
			h.Mount = filepath.Join(dir, name)
			h.Args = append([]string{"mount", "--config", st.Config, "--site", site, "--config-wait", "2m",
				"--peer-listen", net.JoinHostPort(h.Addr, fmt.Sprint(peerPort))}, common...)
			h.Args = append(h.Args, h.Mount)
		}
		return h
	}
	st.Namespaces = []string{st.Prefix + "wan"}
	for i, site := range o.Sites {
		st.Namespaces = append(st.Namespaces, st.Prefix+site)
		if i < members {
			st.Hosts = append(st.Hosts, host(site, i, site+"-c", RoleConfig, configHostNumber))
		}
	}
	for i, site := range o.Sites {
		for n := 1; n <= o.ServersPerSite+o.ClientsPerSite; n++ {
			role := RoleNode
			if n > o.ServersPerSite {
				role = RoleClient
			}
			st.Hosts = append(st.Hosts, host(site, i, fmt.Sprintf("%s-%d", site, n), role, firstHostNumber+n-1))
		}
	}
	for _, h := range st.Hosts {
		st.Namespaces = append(st.Namespaces, h.NS)
	}
	st.Router = Host{Name: "router", NS: st.Prefix + "wan",
		Log: filepath.Join(dir, "logs", "router.log"), Args: []string{"testbed", "router", dir}}
	return st
}

// startWave is how many hosts start at once (see Up).
const startWave = 25

// buildNetwork makes the namespaces, links, addresses, routes and qdiscs:
//
//	host ns (eth0) ──veth── site ns (bridge br, gateway .1) ──veth wan── wan ns ── delay router (TUN)
func (st *State) buildNetwork() error {
	for _, name := range st.Namespaces {
		if err := createNS(name); err != nil {
			return err
		}
	}
	wan, wanNS, err := handle(st.Prefix + "wan")
	if err != nil {
		return err
	}
	defer wan.Close()
	defer wanNS.Close()
	if err := withNS(st.Prefix+"wan", func() error {
		for _, k := range []string{"ipv4/ip_forward", "ipv4/conf/all/rp_filter", "ipv4/conf/default/rp_filter"} {
			v := "1"
			if strings.HasSuffix(k, "rp_filter") {
				v = "0" // packets re-enter from the TUN device with a site's source
			}
			if err := sysctl(k, v); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for i, site := range st.Opts.Sites {
		if err := st.buildSite(i, site, wan, wanNS); err != nil {
			return fmt.Errorf("site %s: %w", site, err)
		}
	}
	if st.Opts.NoSlowStartAfterIdle {
		for _, h := range st.Hosts {
			if err := withNS(h.NS, func() error { return sysctl("ipv4/tcp_slow_start_after_idle", "0") }); err != nil {
				return fmt.Errorf("host %s: %w", h.Name, err)
			}
		}
	}
	return nil
}

func (st *State) buildSite(i int, site string, wan *netlink.Handle, wanNS netns.NsHandle) error {
	sh, siteNS, err := handle(st.Prefix + site)
	if err != nil {
		return err
	}
	defer sh.Close()
	defer siteNS.Close()
	if err := withNS(st.Prefix+site, func() error { return sysctl("ipv4/ip_forward", "1") }); err != nil {
		return err
	}
	if err := sh.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br"}}); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	if err := addrUp(sh, "br", siteGateway(i), 24); err != nil {
		return err
	}
	wanLink := fmt.Sprintf("s%d", i)
	if err := vethBetween(siteNS, "wan", wanNS, wanLink); err != nil {
		return err
	}
	if err := addrUp(sh, "wan", wanSiteSide(i), 24); err != nil {
		return err
	}
	if err := routeVia(sh, nil, wanRouterSide(i), ""); err != nil {
		return err
	}
	if err := addrUp(wan, wanLink, wanRouterSide(i), 24); err != nil {
		return err
	}
	if err := routeVia(wan, ipNet(siteNet(i)), wanSiteSide(i), ""); err != nil {
		return err
	}
	rule := netlink.NewRule()
	rule.IifName, rule.Table, rule.Priority = wanLink, wanTable, 100
	if err := wan.RuleAdd(rule); err != nil {
		return fmt.Errorf("rule iif %s: %w", wanLink, err)
	}
	if err := setUplink(sh, "wan", st.Opts.Uplink); err != nil {
		return err
	}
	br, err := sh.LinkByName("br")
	if err != nil {
		return err
	}
	for _, h := range st.Hosts {
		if h.Site != site {
			continue
		}
		hh, hostNS, err := handle(h.NS)
		if err != nil {
			return err
		}
		port := "h" + strings.TrimPrefix(h.Name, site+"-")
		err = vethBetween(hostNS, "eth0", siteNS, port)
		if err == nil {
			var l netlink.Link
			if l, err = sh.LinkByName(port); err == nil {
				err = sh.LinkSetMaster(l, br)
			}
		}
		if err == nil {
			err = addrUp(sh, port, netipInvalid, 0)
		}
		if err == nil {
			err = addrUp(hh, "eth0", mustAddr(h.Addr), 24)
		}
		if err == nil {
			err = routeVia(hh, nil, siteGateway(i), st.Opts.TCPCongestion)
		}
		hh.Close()
		hostNS.Close()
		if err != nil {
			return fmt.Errorf("host %s: %w", h.Name, err)
		}
	}
	return nil
}

// waitRouter waits until the router's TUN device is up.
func (st *State) waitRouter(ctx context.Context) error {
	wan, ns, err := handle(st.Prefix + "wan")
	if err != nil {
		return err
	}
	defer wan.Close()
	defer ns.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l, err := wan.LinkByName(tunName); err == nil && l.Attrs().Flags&net.FlagUp != 0 {
			routes, _ := wan.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: wanTable}, netlink.RT_FILTER_TABLE)
			if len(routes) > 0 {
				return nil
			}
		}
		if !st.Router.alive() {
			return fmt.Errorf("delay router exited; last lines of %s:\n%s", st.Router.Log, tail(st.Router.Log, 15))
		}
		if time.Now().After(deadline) {
			return errors.New("delay router did not come up within 10s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Down stops every process, unmounts every mount and removes every
// namespace (and with them links and qdiscs) of the testbed in dir, also
// when up was interrupted or the state file is gone. Data and logs stay.
func Down(dir string, out io.Writer) error {
	return withDirLock(dir, func(dir string) error {
		st, err := Load(dir)
		if err != nil {
			st = &State{Dir: dir, Prefix: prefixFor(dir)}
		}
		if err := teardown(st, out); err != nil {
			return err
		}
		return removeState(dir, out)
	})
}

// removeState removes the state file once everything it names is gone.
func removeState(dir string, out io.Writer) error {
	if err := os.Remove(filepath.Join(dir, stateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	fmt.Fprintf(out, "testbed in %s is down (logs kept in %s)\n", dir, filepath.Join(dir, "logs"))
	return nil
}

func teardown(st *State, out io.Writer) error {
	names := slices.Clone(st.Namespaces)
	for _, n := range namedNamespaces(st.Prefix) {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	// Mounts and config members first and gracefully, so that nodes hand
	// their locks back; whatever is left in our namespaces is then killed.
	var hosts []*Host
	for i := range st.Hosts {
		hosts = append(hosts, &st.Hosts[i])
	}
	slices.SortStableFunc(hosts, func(a, b *Host) int { return boolInt(a.Role == RoleConfig) - boolInt(b.Role == RoleConfig) })
	live := 0
	for _, h := range hosts {
		if h.alive() {
			live++
			_ = syscall.Kill(h.PID, syscall.SIGTERM)
		}
	}
	if live > 0 {
		fmt.Fprintf(out, "stopping %d processes\n", live)
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, h := range hosts {
		for h.alive() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	inodes := map[uint64]bool{}
	for _, n := range names {
		if ino, err := nsInode(n); err == nil {
			inodes[ino] = true
		}
	}
	for try := 0; try < 100; try++ {
		pids := processesIn(inodes)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if pids := processesIn(inodes); len(pids) > 0 {
		return fmt.Errorf("processes %v in the testbed's namespaces did not die", pids)
	}
	for _, m := range mountinfo.Under(st.Dir) {
		unmountDead(m)
	}
	if ms := mountinfo.Under(st.Dir); len(ms) > 0 {
		return fmt.Errorf("still mounted: %s", strings.Join(ms, " "))
	}
	for _, n := range names {
		if err := deleteNS(n); err != nil {
			return fmt.Errorf("remove network namespace %s: %w", n, err)
		}
	}
	if len(names) > 0 {
		fmt.Fprintf(out, "removed %d network namespaces\n", len(names))
	}
	for i := range st.Hosts {
		os.Remove(st.Hosts[i].Ready)
	}
	return nil
}

// Partition cuts site off from every other site, or only from `from`.
func Partition(dir, site, from string) error {
	return modify(dir, func(st *State) error {
		if _, err := st.SiteIndex(site); err != nil {
			return err
		}
		others := st.Opts.Sites
		if from != "" {
			if _, err := st.SiteIndex(from); err != nil {
				return err
			}
			if from == site {
				return errors.New("a site cannot be cut off from itself")
			}
			others = []string{from}
		}
		for _, o := range others {
			if k := pairKey(site, o); o != site && !slices.Contains(st.Cuts, k) {
				st.Cuts = append(st.Cuts, k)
			}
		}
		return nil
	})
}

// Heal restores the links of site (every link when site is empty).
func Heal(dir, site string) error {
	return modify(dir, func(st *State) error {
		if site == "" {
			st.Cuts = nil
			return nil
		}
		if _, err := st.SiteIndex(site); err != nil {
			return err
		}
		st.Cuts = slices.DeleteFunc(st.Cuts, func(k string) bool {
			a, b, _ := strings.Cut(k, ",")
			return a == site || b == site
		})
		return nil
	})
}

// SetRTT replaces the RTTs of the pairs in m.
func SetRTT(dir string, m RTTMatrix) error {
	return modify(dir, func(st *State) error {
		for k, v := range m {
			a, b, _ := strings.Cut(k, ",")
			if _, err := st.SiteIndex(a); err != nil {
				return err
			}
			if _, err := st.SiteIndex(b); err != nil {
				return err
			}
			st.Opts.RTT[k] = v
		}
		return nil
	})
}

// modify changes the links in the state file and tells the router.
func modify(dir string, change func(*State) error) error {
	return locked(dir, func(st *State) error {
		if err := change(st); err != nil {
			return err
		}
		if err := st.Save(); err != nil {
			return err
		}
		if !st.Router.alive() {
			return errors.New("the delay router is not running ('wheelfs testbed status'); down and up again")
		}
		return syscall.Kill(st.Router.PID, syscall.SIGHUP)
	})
}

// locked runs fn on the testbed's state with the directory locked.
func locked(dir string, fn func(*State) error) error {
	return withDirLock(dir, func(dir string) error {
		st, err := Load(dir)
		if err != nil {
			return err
		}
		return fn(st)
	})
}

// withDirLock runs fn on the absolute directory with it locked.
func withDirLock(dir string, fn func(abs string) error) error {
	dir, err := absDir(dir)
	if err != nil {
		return err
	}
	release, err := lockDir(dir)
	if err != nil {
		return err
	}
	defer release()
	return fn(dir)
}

// Kill stops hosts' processes together: SIGTERM (a clean stop that hands
// slice locks back) or, with kill9, SIGKILL (a crash). Every host is
// signalled before any is waited for, so several hosts stop at once.
func Kill(dir string, names []string, kill9 bool) error {
	return onHosts(dir, names, func(st *State, hs []*Host) error { return stopAll(hs, kill9) })
}

// Restart stops hosts' processes if they run and starts them again on
// the same data, waiting until every one serves. The hosts stop together
// and start together, as after a power cut or a coordinated restart.
func Restart(ctx context.Context, dir string, names []string) error {
	return onHosts(dir, names, func(st *State, hs []*Host) error {
		if err := stopAll(hs, false); err != nil {
			return err
		}
		for _, h := range hs {
			if err := st.start(h); err != nil {
				return err
			}
		}
		if err := st.Save(); err != nil {
			return err
		}
		for _, h := range hs {
			if err := h.waitReady(ctx, readyTimeout); err != nil {
				return err
			}
		}
		return nil
	})
}

// stopAll signals every host, then waits for each to exit.
func stopAll(hs []*Host, kill9 bool) error {
	errs := make([]error, len(hs))
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = h.stop(kill9, 30*time.Second)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func onHosts(dir string, names []string, fn func(*State, []*Host) error) error {
	return locked(dir, func(st *State) error {
		var hs []*Host
		for _, name := range names {
			h, err := st.Host(name)
			if err != nil {
				return err
			}
			if slices.Contains(hs, h) {
				return fmt.Errorf("host %s named twice", name)
			}
			hs = append(hs, h)
		}
		return fn(st, hs)
	})
}

// Exec runs argv inside a host's network namespace (same mounts, same
// user), with the caller's standard streams.
func Exec(dir, name string, argv []string) error {
	st, err := Load(dir)
	if err != nil {
		return err
	}
	ns := st.Prefix + "wan"
	if name != "router" {
		h, err := st.Host(name)
		if err != nil {
			return err
		}
		ns = h.NS
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := startIn(ns, cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// InHost runs fn on an OS thread moved into a host's network namespace
// (the router's for "router"), so that an experiment can act as that host
// without a child process: a socket fn creates (net.Listen, a dial) stays
// in the namespace for its life, and a process fn starts (exec.Cmd.Start)
// runs there. Goroutines fn starts do not run in the namespace.
func (st *State) InHost(name string, fn func() error) error {
	ns := st.Prefix + "wan"
	if name != "router" {
		h, err := st.Host(name)
		if err != nil {
			return err
		}
		ns = h.NS
	}
	return withNS(ns, fn)
}

// WriteStatus prints the hosts and links of the testbed.
func WriteStatus(w io.Writer, st *State) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tSITE\tROLE\tADDRESS\tPID\tSTATE\tMOUNT")
	rows := append([]Host{st.Router}, st.Hosts...)
	for _, h := range rows {
		state, pid := "down", "-"
		if h.alive() {
			state, pid = "running", fmt.Sprint(h.PID)
			if h.Ready != "" {
				if _, err := os.Stat(h.Ready); err != nil {
					state = "starting"
				} else {
					state = "ready"
				}
			}
		}
		site, role, addr, mount := h.Site, string(h.Role), h.Addr, h.Mount
		if h.Name == "router" {
			site, role, addr = "-", "delay router", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", h.Name, site, role, addr, pid, state, dash(mount))
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LINK\tRTT\tSTATE")
	for i, a := range st.Opts.Sites {
		for _, b := range st.Opts.Sites[i+1:] {
			state := "up"
			if slices.Contains(st.Cuts, pairKey(a, b)) {
				state = "cut"
			}
			fmt.Fprintf(tw, "%s-%s\t%s\t%s\n", a, b, st.Opts.RTT.Get(a, b), state)
		}
	}
	tw.Flush()
	if st.Opts.Uplink > 0 {
		fmt.Fprintf(w, "\nsite uplinks: %s each\n", formatRate(st.Opts.Uplink))
	}
	fmt.Fprintf(w, "\nconfig service: %s (wheelfs status --config %s --ca %s)\n", st.Config, strings.Split(st.Config, ",")[0], st.CA)
}

func formatRate(bps uint64) string {
	switch {
	case bps >= 1e9 && bps%1e9 == 0:
		return fmt.Sprintf("%dgbit", bps/1e9)
	case bps >= 1e6 && bps%1e6 == 0:
		return fmt.Sprintf("%dmbit", bps/1e6)
	case bps >= 1e3 && bps%1e3 == 0:
		return fmt.Sprintf("%dkbit", bps/1e3)
	}
	return fmt.Sprintf("%dbit", bps)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// progress prints numbered steps of a long command.
type progress struct {
	out      io.Writer
	n, total int
	start    time.Time
}

func (p *progress) step(what string) {
	if p.start.IsZero() {
		p.start = time.Now()
	}
	p.n++
	fmt.Fprintf(p.out, "[%2d/%d %5.1fs] %s\n", p.n, p.total, time.Since(p.start).Seconds(), what)
}
