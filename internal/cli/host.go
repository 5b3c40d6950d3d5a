package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/wheelfs/wheelfs/internal/auth"
	"github.com/wheelfs/wheelfs/internal/bench"
	"github.com/wheelfs/wheelfs/internal/client"
	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fusefs"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/server"
)

// kernelAttrTimeout is the longest a mount lets the kernel cache
// attributes: as long as the names (fusefs), and never past the core's
// lease, whose revocation takes them back.
const kernelAttrTimeout = 10 * time.Second

// hostFlags are the flags shared by the commands that run a host (up,
// config, server, mount, node), bound to one deploy.Config.
type hostFlags struct {
	data, site, listen     string
	config, etcd           string
	ca, nodeDir            string
	lockTTL, configWait    time.Duration
	memberTTL              time.Duration
	maintain               time.Duration
	lease                  time.Duration
	debug                  bool
	pprofAddr              string
	memberListen, peerList string
	peers                  string
	cacheMem, cacheDisk    string
	cacheDir               string
	readyFile              string
	trustUIDs              bool
	configAuth             bool
	unsignedSessions       bool
	flags                  *pflag.FlagSet
	sessionTTL             time.Duration
	peerListen, peerRate   string
	peerConc               int
	rate                   server.RateLimit
	diskReserve            string
}

// roleFlags registers the flags a role needs.
func (f *hostFlags) register(cmd *cobra.Command, roles deploy.Roles) {
	fl := cmd.Flags()
	f.flags = fl
	fl.StringVar(&f.ca, "ca", "", "deployment CA `DIR` (made by 'wheelfs ca init') to issue this node's certificate from on first start")
	fl.StringVar(&f.nodeDir, "node-dir", "", "node credentials `DIR` issued by 'wheelfs ca issue' (instead of --ca)")
	fl.DurationVar(&f.configWait, "config-wait", 30*time.Second, "how long to wait for the configuration service at start")
	fl.StringVar(&f.readyFile, "ready-file", "", "create this `FILE` once the host serves (the mount answers, if any); removed on exit")
	fl.StringVar(&f.pprofAddr, "pprof", "", "serve Go profiling endpoints (net/http/pprof) on this loopback address")
	if roles&deploy.RoleMember == 0 {
		fl.StringVar(&f.config, "config", "", "configuration service: comma-separated HOST:PORT of one or more config members (required)")
		fl.StringVar(&f.etcd, "etcd", "", "comma-separated endpoints of an existing etcd cluster (instead of --config)")
	}
	if roles&(deploy.RoleServer|deploy.RoleClient) != 0 {
		fl.StringVar(&f.site, "site", "local", "this node's site name")
	}
	if roles&(deploy.RoleServer|deploy.RoleMember) != 0 {
		fl.BoolVar(&f.configAuth, "config-auth", true, "the configuration service's authentication (etcd auth, a user per node certificate name: client hosts may only read the tables, and 'wheelfs ca revoke' shuts a node out of etcd): "+
			"by default a host holding the CA key turns it on when it creates the deployment (not with --etcd); --config-auth turns it on in an existing deployment too, --config-auth=false never (an opt-out). "+
			"Once it is on, nodes without the CA key need 'wheelfs ca issue --config' (docs/SECURITY.md)")
	}
	if roles&deploy.RoleServer != 0 {
		fl.StringVar(&f.listen, "listen", "127.0.0.1:0", "storage server gRPC listen address HOST:PORT")
		fl.DurationVar(&f.lockTTL, "lock-ttl", 2*time.Minute, "slice lock lease length L")
		fl.DurationVar(&f.maintain, "maintain-period", time.Second, "how often replicas ping each other and repair their slices")
		fl.DurationVar(&f.memberTTL, "member-ttl", 0, "membership lease: a server cut off from the config majority for longer drops out of the table "+
			"and its replicas are repaired elsewhere (default 10s; at least 3s and 3 maintenance periods, at most --lock-ttl)")
		fl.BoolVar(&f.trustUIDs, "trust-client-uids", false, "act for whatever uid a client host sends, as NFS AUTH_SYS does (default: a client host that runs no server needs 'wheelfs login' per uid)")
		fl.BoolVar(&f.unsignedSessions, "unsigned-sessions", false, "also admit login sessions no server signed (written before sessions were signed): an opt-out for a rolling upgrade, in which any node that can write to the configuration service can give itself a session (docs/SECURITY.md)")
		fl.DurationVar(&f.sessionTTL, "session-ttl", auth.DefaultSessionTTL, "how long a login lasts unless its mount renews it")
		fl.Float64Var(&f.rate.Rate, "client-rate", server.DefaultClientRate, "requests per second one client node may send this server (a call moving blocks costs one more per 16); servers' own traffic is not limited; negative: no limit")
		fl.IntVar(&f.rate.Burst, "client-burst", server.DefaultClientBurst, "requests one client node may send at once above --client-rate")
		fl.DurationVar(&f.rate.Wait, "client-wait", server.DefaultClientWait, "how long a request over --client-rate may wait for its turn before it is refused (EAGAIN; the client retries)")
		fl.StringVar(&f.diskReserve, "disk-reserve", "", "free space of the data directory's file system below which this server counts as full and gets no new data, e.g. 1GiB (default: 2% of the file system, at most 512MiB; 0: never full)")
		fl.DurationVar(&f.lease, "lease", server.DefaultLeaseTTL, fmt.Sprintf("length of the meta-data leases a primary grants clients (capped by --lock-ttl; shorter than the clients' %v call bound, within which a write may wait one out)", client.DefaultTimeout))
	}
	if roles&deploy.RoleClient != 0 {
		fl.BoolVar(&f.debug, "debug", false, "log every FUSE request")
		fl.StringVar(&f.cacheMem, "cache-mem", "100MiB", "in-memory block cache size")
		fl.StringVar(&f.cacheDisk, "cache-disk", "4GiB", "on-disk block cache size (0 turns it off)")
		fl.StringVar(&f.cacheDir, "cache-dir", "", "on-disk block cache directory (default DATA/cache)")
		fl.StringVar(&f.peerListen, "peer-listen", "127.0.0.1:0", "serve cached blocks to other clients' .Hotspot reads on HOST:PORT (mutual TLS; empty: do not serve)")
		fl.StringVar(&f.peerRate, "peer-upload-rate", "0", "bound the bytes per second served to other clients, e.g. 2MiB (0: unlimited)")
		fl.IntVar(&f.peerConc, "peer-upload-concurrency", client.DefaultUploadConcurrency, "peer requests served at once")
	}
}

// endpoints returns the configuration service endpoints of --config or
// --etcd.
func (f *hostFlags) endpoints() ([]string, error) {
	if f.config != "" && f.etcd != "" {
		return nil, errors.New("give either --config or --etcd, not both")
	}
	list := f.config
	if list == "" {
		list = f.etcd
	}
	var out []string
	for _, e := range strings.Split(list, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("missing --config HOST:PORT[,HOST:PORT...] (a config member's address) or --etcd ENDPOINTS")
	}
	return out, nil
}

// deployConfig builds the deploy.Config of a role from the flags.
func (f *hostFlags) deployConfig(g *globalFlags, roles deploy.Roles) (deploy.Config, error) {
	cfg := deploy.NewConfig(f.data)
	cfg.Roles, cfg.Logger, cfg.InitCA = roles, g.logger(), false
	cfg.Site, cfg.Listen, cfg.LockTTL, cfg.ConfigWait = f.site, f.listen, f.lockTTL, f.configWait
	cfg.Server.MaintainPeriod = f.maintain
	cfg.MemberTTL = f.memberTTL
	cfg.Server.LeaseTTL = f.lease
	cfg.TrustClientUIDs, cfg.SessionTTL = f.trustUIDs, f.sessionTTL
	cfg.UnsignedSessions = f.unsignedSessions
	switch {
	case f.flags != nil && f.flags.Changed("config-auth") && f.configAuth:
		cfg.ConfigAuth = deploy.ConfigAuthOn
	case f.flags != nil && f.flags.Changed("config-auth"), f.etcd != "":
		// An etcd that is not WheelFS's own may serve others, whom
		// its auth would shut out: only when asked.
		cfg.ConfigAuth = deploy.ConfigAuthOff
	default:
		cfg.ConfigAuth = deploy.ConfigAuthNew
	}
	cfg.Server.RateLimit = f.rate
	if f.diskReserve != "" {
		r, err := bench.ParseSize(f.diskReserve)
		if err != nil || r < 0 {
			return cfg, fmt.Errorf("--disk-reserve %q: want a size such as 1GiB, or 0 (%v)", f.diskReserve, err)
		}
		cfg.Server.DiskReserve = r
		if r == 0 {
			cfg.Server.DiskReserve = -1 // never full
		}
	}
	if f.ca != "" && f.nodeDir != "" {
		return cfg, errors.New("give either --ca or --node-dir, not both")
	}
	for _, d := range []*string{&f.ca, &f.nodeDir} {
		if *d == "" {
			continue
		}
		abs, err := filepath.Abs(*d)
		if err != nil {
			return cfg, err
		}
		if _, err := os.Stat(abs); err != nil {
			return cfg, fmt.Errorf("credentials directory: %w", err)
		}
		*d = abs
	}
	cfg.CADir, cfg.NodeDir = f.ca, f.nodeDir
	if roles&deploy.RoleMember == 0 {
		eps, err := f.endpoints()
		if err != nil {
			return cfg, err
		}
		cfg.Etcd = eps
	}
	if cfg.DataDir == "" {
		return cfg, errors.New("missing --data DIR")
	}
	if roles&deploy.RoleClient != 0 {
		if err := f.cacheConfig(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// cacheConfig sets the client's block cache from --cache-mem, --cache-disk
// and --cache-dir.
func (f *hostFlags) cacheConfig(cfg *deploy.Config) error {
	mem, err := bench.ParseSize(f.cacheMem)
	if err != nil || mem <= 0 {
		return fmt.Errorf("--cache-mem %q: want a positive size such as 100MiB (%v)", f.cacheMem, err)
	}
	disk, err := bench.ParseSize(f.cacheDisk)
	if err != nil || disk < 0 {
		return fmt.Errorf("--cache-disk %q: want a size such as 4GiB, or 0 (%v)", f.cacheDisk, err)
	}
	cfg.Client.CacheBytes, cfg.Client.DiskCacheBytes = mem, disk
	up, err := bench.ParseSize(f.peerRate)
	if err != nil || up < 0 {
		return fmt.Errorf("--peer-upload-rate %q: want a size per second such as 2MiB, or 0 (%v)", f.peerRate, err)
	}
	cfg.Peer = deploy.PeerConfig{Listen: f.peerListen, UploadRate: up, UploadConcurrency: f.peerConc}
	if disk > 0 {
		cfg.Client.CacheDir = f.cacheDir
		if cfg.Client.CacheDir == "" {
			cfg.Client.CacheDir = filepath.Join(cfg.DataDir, "cache")
		}
	}
	return nil
}

// mountStateDir is where `wheelfs mount` without --data keeps its identity
// and credentials: /var/lib/wheelfs/mount-<hash> for root, else
// $XDG_STATE_HOME/wheelfs/mount-<hash> (default ~/.local/state), where
// <hash> names the mount point.
func mountStateDir(mountpoint string) string {
	sum := sha256.Sum256([]byte(mountpoint))
	name := "mount-" + hex.EncodeToString(sum[:6])
	if os.Getuid() == 0 {
		return filepath.Join("/var/lib/wheelfs", name)
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "wheelfs", name)
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "wheelfs", name)
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("wheelfs-%d", os.Getuid()), name)
}

// runHost starts a host and runs it in the foreground until ctx ends (or,
// with a mount point, until the file system is unmounted), then stops it.
func runHost(ctx context.Context, g *globalFlags, f *hostFlags, cfg deploy.Config, mountpoint string) error {
	log := cfg.Logger
	if f.pprofAddr != "" {
		servePprof(f.pprofAddr, log)
	}
	var mnt string
	if mountpoint != "" {
		var err error
		if mnt, err = checkMountpoint(mountpoint); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "wheelfs: starting (data in %s)...\n", cfg.DataDir)
	host, err := deploy.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer host.Close()
	describe(host, cfg)
	if mnt == "" {
		if err := markReady(f.readyFile); err != nil {
			return err
		}
		defer os.Remove(f.readyFile)
		fmt.Printf("WheelFS %s running (data in %s). Press Ctrl-C or send SIGTERM to stop.\n", roleName(cfg.Roles), cfg.DataDir)
		<-ctx.Done()
		fmt.Fprintln(os.Stderr, "wheelfs: stopping...")
	} else {
		// The kernel asks for the root's attributes while mounting: a
		// deployment that is still starting must not fail the mount.
		if err := waitForRoot(ctx, host.Client, cfg.ConfigWait, log); err != nil {
			return err
		}
		srv, err := fusefs.Mount(mnt, host.Client, fusefs.Options{
			Logger: log, AttrTimeout: kernelAttrTimeout, AllowOther: os.Getuid() == 0, Debug: f.debug})
		if err != nil {
			return fmt.Errorf("mount %s: %w (is fuse3 installed and /dev/fuse available?)", mnt, err)
		}
		exited := make(chan struct{})
		go func() { srv.Wait(); close(exited) }()
		if stop, err := serveLogins(ctx, mnt, host.Client, log); err != nil {
			log.Warn("wheelfs login will not reach this mount", "err", err)
		} else {
			defer stop()
		}
		// fusefs.Mount returns once the kernel has sent its first request.
		if err := markReady(f.readyFile); err != nil {
			unmount(mnt, srv.Unmount, log.Warn)
			return err
		}
		defer os.Remove(f.readyFile)
		fmt.Printf("WheelFS mounted at %s (data in %s). Press Ctrl-C or send SIGTERM to unmount and stop.\n", mnt, cfg.DataDir)
		select {
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "wheelfs: unmounting...")
			unmount(mnt, srv.Unmount, log.Warn)
			<-exited
		case <-exited:
			fmt.Fprintln(os.Stderr, "wheelfs: unmounted externally; stopping")
		}
	}
	if err := host.Close(); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wheelfs: stopped")
	return nil
}

// markReady creates the --ready-file atomically (a temporary file renamed
// into place), so a waiting script never sees it half written.
func markReady(path string) error {
	if path == "" {
		return nil
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("--ready-file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--ready-file: %w", err)
	}
	return nil
}

func describe(h *deploy.Host, cfg deploy.Config) {
	msg := fmt.Sprintf("wheelfs: %s %s, config service at %s", roleName(cfg.Roles), h.ServerID(),
		strings.Join(h.ConfigEndpoints(), ","))
	if cfg.Roles&deploy.RoleServer != 0 {
		msg += fmt.Sprintf(", storage server at %s site %q", h.Addr(), cfg.Site)
	}
	fmt.Fprintln(os.Stderr, msg)
}

func roleName(r deploy.Roles) string {
	switch r {
	case deploy.RolesUp:
		return "host"
	case deploy.RoleMember:
		return "config member"
	case deploy.RoleServer:
		return "storage server"
	case deploy.RoleClient:
		return "client"
	case deploy.RoleServer | deploy.RoleClient:
		return "node"
	}
	return "host"
}

// waitForRoot waits, up to wait, until the root directory's primary
// answers, saying what it waits for every few seconds.
func waitForRoot(ctx context.Context, fs *client.FS, wait time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(wait)
	said := time.Now()
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := fs.GetAttr(actx, client.User{}, client.NoCues, oid.Root)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("the root directory's server did not answer within %v (--config-wait): %w", wait, err)
		case time.Since(said) > 3*time.Second:
			log.Info("waiting for the root directory's server", "err", err)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
