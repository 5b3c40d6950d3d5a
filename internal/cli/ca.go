package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/configsvc"
	"github.com/wheelfs/wheelfs/internal/pki"
)

func newCA(g *globalFlags) *cobra.Command {
	ca := &cobra.Command{
		Use:   "ca",
		Short: "Manage the deployment's certificate authority",
	}
	var name string
	initCmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Create the deployment CA in DIR (once per deployment)",
		Long: `Create the deployment's certificate authority (ca.crt, ca.key) in DIR.

Give DIR to every node with --ca: a node issues its own certificate from it on
first start. Or keep ca.key on one machine and hand out node directories made
with 'wheelfs ca issue' (--node-dir).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := os.Stat(filepath.Join(args[0], pki.CACertFile)); err == nil {
				return fmt.Errorf("%s already holds a CA; a deployment has one CA", args[0])
			}
			c, err := pki.InitCA(args[0], name)
			if err != nil {
				return err
			}
			fmt.Printf("CA %q created in %s (keep %s secret)\n", c.Cert.Subject.CommonName, args[0], pki.CAKeyFile)
			return nil
		},
	}
	initCmd.Flags().StringVar(&name, "name", "wheelfs", "deployment name written into the CA certificate")

	var caDir, nodeName, out, config string
	var hosts []string
	var days int
	var renew, server bool
	issue := &cobra.Command{
		Use:   "issue --ca DIR --name NAME --out NODEDIR [--server] [--config HOST:PORT]",
		Short: "Issue a node directory (ca.crt, node.crt, node.key) for a node that does not get the CA key",
		Long: `Issue a node directory (ca.crt, node.crt, node.key) for a node that does not get
the CA key. The certificate lives --days days; nodes that hold the CA key renew
their own when a third of that is left, others warn in their log and in
'wheelfs status', and need a re-issue: --renew replaces the credentials in
NODEDIR (a running node's DATA/node directory, for instance) with fresh ones
for the same name and addresses, and the node picks them up within its
certificate check period (an hour) or at its next start.

Give --server for a node that runs a server or a config member: its
certificate then carries the server role, without which a server cannot sign
users' login sessions (other servers refuse them). --renew keeps the role.

With --config HOST:PORT, the node also gets its user in the configuration
service, which it needs where that service's authentication is on (the
default in a deployment created by a host holding the CA key;
docs/SECURITY.md): a client host's user may only read the tables, a
server's (--server) may write them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if caDir == "" || out == "" || (nodeName == "" && !renew) {
				return errors.New("ca issue needs --ca DIR, --name NAME (or --renew) and --out NODEDIR")
			}
			c, err := pki.LoadCA(caDir)
			if err != nil {
				return err
			}
			if days < 1 {
				return fmt.Errorf("--days %d: a certificate lives at least a day", days)
			}
			c.NodeValidity = time.Duration(days) * 24 * time.Hour
			if _, err := os.Stat(filepath.Join(out, pki.NodeCertFile)); err == nil && !renew {
				return fmt.Errorf("%s already holds node credentials (--renew replaces them)", out)
			} else if renew {
				old, err := pki.LoadCredentials(out)
				if err != nil {
					return fmt.Errorf("--renew: %w", err)
				}
				if nodeName != "" && nodeName != old.Name {
					return fmt.Errorf("--renew: %s holds node %q, not %q", out, old.Name, nodeName)
				}
				leaf := old.Cert.Leaf
				nodeName = old.Name
				// A re-issue keeps the role; --server adds it to a
				// certificate issued before roles existed.
				server = server || pki.HasServerRole(leaf)
				for _, d := range leaf.DNSNames {
					hosts = append(hosts, d)
				}
				for _, ip := range leaf.IPAddresses {
					hosts = append(hosts, ip.String())
				}
			}
			var dns []string
			var ips []net.IP
			for _, h := range hosts {
				if ip := net.ParseIP(h); ip != nil {
					ips = append(ips, ip)
				} else {
					dns = append(dns, h)
				}
			}
			c.Server = server
			if err := c.IssueNodeDir(out, nodeName, dns, ips); err != nil {
				return err
			}
			fmt.Printf("node %q credentials (%s) written to %s; start the node with --node-dir %s\n", nodeName, roleWord(server), out, out)
			if config == "" {
				return nil
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			admin, err := dialAdmin(ctx, g, c, splitList(config))
			if err != nil {
				return err
			}
			defer admin.Close()
			if err := admin.AddNodeUser(ctx, nodeName, server); err != nil {
				return err
			}
			fmt.Printf("node %q may use the configuration service (as a %s)\n", nodeName, roleWord(server))
			return nil
		},
	}
	fl := issue.Flags()
	fl.StringVar(&caDir, "ca", "", "deployment CA `DIR` (made by 'wheelfs ca init')")
	fl.StringVar(&nodeName, "name", "", "node name (its ID in the deployment, e.g. srv-west-1)")
	fl.StringVar(&out, "out", "", "node `DIR` to create")
	fl.StringSliceVar(&hosts, "host", nil, "host names or IP addresses the node is reached at (repeatable)")
	fl.IntVar(&days, "days", int(pki.DefaultNodeValidity/(24*time.Hour)), "certificate lifetime in days")
	fl.BoolVar(&renew, "renew", false, "replace the credentials in --out with fresh ones for the same node")
	fl.StringVar(&config, "config", "", "configuration service (HOST:PORT,...): also add the node's user there, needed when its authentication is on")
	fl.BoolVar(&server, "server", false, "the node runs a server or a config member: its certificate carries the server role (needed to sign logins) and, with --config, its etcd user may write the tables")
	ca.AddCommand(initCmd, issue, newRevoke(g))
	return ca
}

func roleWord(server bool) string {
	if server {
		return "server"
	}
	return "client"
}

// dialAdmin connects to the configuration service as its administrator
// (pki.RootCredentials from the CA key).
func dialAdmin(ctx context.Context, g *globalFlags, ca *pki.CA, endpoints []string) (*configsvc.EtcdService, error) {
	root, err := ca.RootCredentials()
	if err != nil {
		return nil, err
	}
	return configsvc.Dial(ctx, endpoints, root.ClientTLS(""), configsvc.Options{Logger: g.logger(), OneShot: true})
}

func newRevoke(g *globalFlags) *cobra.Command {
	var data, config, etcd, caDir, nodeDir, reason string
	var undo, list bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "revoke NAME --config HOST:PORT [--ca DIR] [--reason TEXT]",
		Short: "Put a node on the deployment's deny list (or take it off with --undo)",
		Long: `Put the node NAME (its certificate's name, as 'wheelfs status' lists servers)
on the deny list in the configuration service. Every node follows the list and,
within about a second, refuses new connections from and to NAME and closes the
ones it has. A revoked server leaves the server table and loses its slice locks,
so its slices are re-replicated as if it had died. --undo takes NAME off the
list; --list prints it.

With the configuration service's authentication on (the default in a new
deployment), the node's etcd user is deleted too, so etcd refuses it: at once
with --ca (which acts as the service's administrator), otherwise as soon as a
host holding the CA key sees the deny list. Without it (a deployment created
before it was the default, or with --config-auth=false), the revoked node can
still reach the configuration service (etcd checks only that a certificate
comes from the CA): to shut it out completely, rotate the CA or turn the
authentication on (docs/SECURITY.md). Credentials come
from --node-dir, --ca or --data, as for 'wheelfs status'.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if list {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				data = defaultDataDir()
			}
			creds, cleanup, err := statusCredentials(data, caDir, nodeDir)
			if err != nil {
				return err
			}
			defer cleanup()
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
			switch {
			case list:
				wctx, stop := context.WithCancel(ctx)
				defer stop()
				ds, ok := <-conf.WatchDenied(wctx)
				if !ok {
					return fmt.Errorf("read the deny list: %w", ctx.Err())
				}
				for _, d := range ds {
					fmt.Printf("%s\t%s\t%s\n", d.Name, d.At.UTC().Format(time.RFC3339), d.Reason)
				}
				return nil
			case undo:
				if err := conf.Undeny(ctx, args[0]); err != nil {
					return err
				}
				fmt.Printf("node %q taken off the deny list\n", args[0])
				if creds.Name == pki.ConfigRoot {
					if on, err := conf.AuthEnabled(ctx); err != nil {
						return err
					} else if on {
						has, err := conf.HasNodeUser(ctx, args[0])
						if err == nil && !has {
							err = conf.AddNodeUser(ctx, args[0], false)
						}
						if err != nil {
							return err
						}
						fmt.Printf("node %q may use the configuration service again (a server needs 'wheelfs ca issue --renew --config --server' too, unless it holds the CA key)\n", args[0])
					}
				}
				return nil
			}
			if args[0] == creds.Name {
				return fmt.Errorf("refusing to revoke %q: it is the node these credentials belong to", args[0])
			}
			if err := conf.Deny(ctx, configsvc.Denial{Name: args[0], Reason: reason}); err != nil {
				return err
			}
			fmt.Printf("node %q revoked; every node refuses it within seconds\n", args[0])
			if creds.Name != pki.ConfigRoot {
				return nil
			}
			if on, err := conf.AuthEnabled(ctx); err != nil {
				return err
			} else if on {
				if _, err := conf.DeleteNodeUser(ctx, args[0]); err != nil {
					return err
				}
				fmt.Printf("node %q's configuration service user deleted: etcd refuses it\n", args[0])
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&data, "data", "", "data `DIR` of a host on this machine (credentials, and endpoints without --config)")
	fl.StringVar(&config, "config", "", "configuration service: comma-separated HOST:PORT of config members")
	fl.StringVar(&etcd, "etcd", "", "endpoints of an existing etcd (instead of --config)")
	fl.StringVar(&caDir, "ca", "", "deployment CA `DIR`: act as the configuration service's administrator with an in-memory certificate from it")
	fl.StringVar(&nodeDir, "node-dir", "", "node credentials `DIR` to authenticate with")
	fl.StringVar(&reason, "reason", "", "why, recorded with the entry")
	fl.BoolVar(&undo, "undo", false, "take NAME off the deny list")
	fl.BoolVar(&list, "list", false, "print the deny list (name, time, reason)")
	fl.DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	return cmd
}
