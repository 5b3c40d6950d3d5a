package cli

import (
	"errors"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/deploy"
)

func newUp(g *globalFlags) *cobra.Command {
	f := &hostFlags{}
	cmd := &cobra.Command{
		Use:   "up [--data DIR] MOUNTPOINT",
		Short: "Run a whole one-host WheelFS (config service, storage server, mount) in the foreground",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.data == "" {
				f.data = defaultDataDir()
			}
			roles := deploy.RolesUp
			if f.etcd != "" {
				roles = deploy.RoleServer | deploy.RoleClient
			}
			cfg, err := f.deployConfig(g, roles)
			if err != nil {
				return err
			}
			cfg.InitCA = true // the zero-configuration deployment makes its own CA
			return runHost(cmd.Context(), g, f, cfg, args[0])
		},
	}
	f.register(cmd, deploy.RolesUp)
	fl := cmd.Flags()
	fl.StringVar(&f.data, "data", "", "data `DIR` (default /var/lib/wheelfs for root, ~/.local/share/wheelfs otherwise)")
	fl.StringVar(&f.etcd, "etcd", "", "comma-separated endpoints of an existing etcd (default: embedded)")
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
