package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/fusefs"
)

func newUp(g *globalFlags) *cobra.Command {
	var (
		data, site, etcd, listen string
		lockTTL                  time.Duration
		debug                    bool
		pprofAddr                string
	)
	cmd := &cobra.Command{
		Use:   "up [--data DIR] MOUNTPOINT",
		Short: "Run a whole one-host WheelFS (config service, storage server, mount) in the foreground",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			log := g.logger()
			if pprofAddr != "" {
				servePprof(pprofAddr, log)
			}
			mnt, err := checkMountpoint(args[0])
			if err != nil {
				return err
			}
			if data == "" {
				data = defaultDataDir()
			}
			cfg := deploy.NewConfig(data)
			cfg.Site, cfg.Listen, cfg.LockTTL, cfg.Logger = site, listen, lockTTL, log
			if etcd != "" {
				cfg.Etcd = strings.Split(etcd, ",")
			}
			fmt.Fprintf(os.Stderr, "wheelfs: starting (data in %s)...\n", data)
			host, err := deploy.Start(ctx, cfg)
			if err != nil {
				return err
			}
			defer host.Close()
			fmt.Fprintf(os.Stderr, "wheelfs: config service at %s, storage server %s at site %q\n",
				strings.Join(host.ConfigEndpoints(), ","), host.ServerID(), site)
			srv, err := fusefs.Mount(mnt, host.Client, fusefs.Options{
				Logger: log, AttrTimeout: time.Second, AllowOther: os.Getuid() == 0, Debug: debug})
			if err != nil {
				return fmt.Errorf("mount %s: %w (is fuse3 installed and /dev/fuse available?)", mnt, err)
			}
			fmt.Printf("WheelFS mounted at %s (data in %s). Press Ctrl-C or send SIGTERM to unmount and stop.\n", mnt, data)
			exited := make(chan struct{})
			go func() { srv.Wait(); close(exited) }()
			select {
			case <-ctx.Done():
				fmt.Fprintln(os.Stderr, "wheelfs: unmounting...")
				unmount(mnt, srv.Unmount, log.Warn)
				<-exited
			case <-exited:
				fmt.Fprintln(os.Stderr, "wheelfs: unmounted externally; stopping")
			}
			if err := host.Close(); err != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, "wheelfs: stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&data, "data", "", "data directory (default /var/lib/wheelfs for root, ~/.local/share/wheelfs otherwise)")
	f.StringVar(&site, "site", "local", "this host's site name")
	f.StringVar(&etcd, "etcd", "", "comma-separated endpoints of an existing etcd (default: embedded)")
	f.StringVar(&listen, "listen", "127.0.0.1:0", "storage server gRPC listen address")
	f.DurationVar(&lockTTL, "lock-ttl", 2*time.Minute, "slice lock lease length L")
	f.BoolVar(&debug, "debug", false, "log every FUSE request")
	f.StringVar(&pprofAddr, "pprof", "", "serve Go profiling endpoints (net/http/pprof) on this loopback address")
	return cmd
}

// unmount retries while the mount is busy, then detaches it lazily so the
// process can always exit.
func unmount(dir string, do func() error, warn func(string, ...any)) {
	for i := 0; i < 20; i++ {
		err := do()
		if err == nil {
			return
		}
		if !errors.Is(err, syscall.EBUSY) && !strings.Contains(err.Error(), "busy") {
			warn("unmount failed", "err", err)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	warn("mount busy; detaching lazily", "mountpoint", dir)
	if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
		warn("lazy unmount failed", "err", err)
	}
}
