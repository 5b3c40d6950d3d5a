package cli

import (
	"fmt"
	"net"
	"strings"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/deploy"
)

func newConfigMember(g *globalFlags) *cobra.Command {
	f := &hostFlags{}
	cmd := &cobra.Command{
		Use:   "config --data DIR --listen HOST:PORT [--peers HOST:PORT,...] (--ca DIR | --node-dir DIR)",
		Short: "Run one member of the replicated configuration service (an embedded etcd member)",
		Long: `Run one member of the configuration service in the foreground.

The first member starts a new cluster. A member given --peers (the client
addresses of running members) joins their cluster on its first start. A
restart on the same --data just restarts the member.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.deployConfig(g, deploy.RoleMember)
			if err != nil {
				return err
			}
			for _, a := range []string{f.memberListen, f.peerList} {
				if err := advertisable(a); err != nil {
					return err
				}
			}
			cfg.Member = deploy.MemberConfig{Listen: f.memberListen, PeerListen: f.peerList, Join: splitList(f.peers)}
			return runHost(cmd.Context(), g, f, cfg, "")
		},
	}
	f.register(cmd, deploy.RoleMember)
	fl := cmd.Flags()
	fl.StringVar(&f.data, "data", "", "data `DIR` of this member (required)")
	fl.StringVar(&f.memberListen, "listen", "", "client address HOST:PORT other nodes reach this member at (required)")
	fl.StringVar(&f.peerList, "peer-listen", "", "peer address HOST:PORT between members (default HOST:PORT+1 of --listen)")
	fl.StringVar(&f.peers, "peers", "", "comma-separated client addresses of running members to join (first start only)")
	cmd.MarkFlagRequired("listen")
	return cmd
}

func newServer(g *globalFlags) *cobra.Command {
	f := &hostFlags{}
	cmd := &cobra.Command{
		Use:   "server --config HOST:PORT [--site NAME] [--listen HOST:PORT] --data DIR",
		Short: "Run a storage server (no mount)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.deployConfig(g, deploy.RoleServer)
			if err != nil {
				return err
			}
			return runHost(cmd.Context(), g, f, cfg, "")
		},
	}
	f.register(cmd, deploy.RoleServer)
	cmd.Flags().StringVar(&f.data, "data", "", "data `DIR` of this server (required)")
	return cmd
}

func newMount(g *globalFlags) *cobra.Command {
	f := &hostFlags{}
	cmd := &cobra.Command{
		Use:   "mount --config HOST:PORT [--site NAME] MOUNTPOINT",
		Short: "Mount WheelFS through the storage servers of a deployment (client only) in the foreground",
		Long: `Mount WheelFS in the foreground; Ctrl-C or SIGTERM unmounts.

Without --data the client keeps its identity and certificate in a state
directory named after the mount point: /var/lib/wheelfs/mount-<hash> for root,
$XDG_STATE_HOME/wheelfs/mount-<hash> (default ~/.local/state) otherwise.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.data == "" {
				mnt, err := checkMountpoint(args[0])
				if err != nil {
					return err
				}
				f.data = mountStateDir(mnt)
			}
			cfg, err := f.deployConfig(g, deploy.RoleClient)
			if err != nil {
				return err
			}
			return runHost(cmd.Context(), g, f, cfg, args[0])
		},
	}
	f.register(cmd, deploy.RoleClient)
	cmd.Flags().StringVar(&f.data, "data", "", "state `DIR` for identity and credentials (default: see above)")
	return cmd
}

func newNode(g *globalFlags) *cobra.Command {
	f := &hostFlags{}
	cmd := &cobra.Command{
		Use:   "node --config HOST:PORT [--site NAME] [--listen HOST:PORT] --data DIR MOUNTPOINT",
		Short: "Run a storage server and a mount on one host, in the foreground",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.deployConfig(g, deploy.RoleServer|deploy.RoleClient)
			if err != nil {
				return err
			}
			return runHost(cmd.Context(), g, f, cfg, args[0])
		},
	}
	f.register(cmd, deploy.RoleServer|deploy.RoleClient)
	cmd.Flags().StringVar(&f.data, "data", "", "data `DIR` of this node (required)")
	return cmd
}

// advertisable checks that other nodes can dial addr: the member
// advertises the address it listens on.
func advertisable(addr string) error {
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen/--peer-listen %q: want HOST:PORT: %w", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return fmt.Errorf("--listen/--peer-listen %q: give the address other nodes reach this member at, not a wildcard", addr)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}
