package cli

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/wheelfs/wheelfs/internal/pki"
)

func newCA() *cobra.Command {
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

	var caDir, nodeName, out string
	var hosts []string
	issue := &cobra.Command{
		Use:   "issue --ca DIR --name NAME --out NODEDIR",
		Short: "Issue a node directory (ca.crt, node.crt, node.key) for a node that does not get the CA key",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if caDir == "" || nodeName == "" || out == "" {
				return errors.New("ca issue needs --ca DIR, --name NAME and --out NODEDIR")
			}
			if _, err := os.Stat(filepath.Join(out, pki.NodeCertFile)); err == nil {
				return fmt.Errorf("%s already holds node credentials", out)
			}
			c, err := pki.LoadCA(caDir)
			if err != nil {
				return err
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
			if err := c.IssueNodeDir(out, nodeName, dns, ips); err != nil {
				return err
			}
			fmt.Printf("node %q credentials written to %s; start the node with --node-dir %s\n", nodeName, out, out)
			return nil
		},
	}
	fl := issue.Flags()
	fl.StringVar(&caDir, "ca", "", "deployment CA `DIR` (made by 'wheelfs ca init')")
	fl.StringVar(&nodeName, "name", "", "node name (its ID in the deployment, e.g. srv-west-1)")
	fl.StringVar(&out, "out", "", "node `DIR` to create")
	fl.StringSliceVar(&hosts, "host", nil, "host names or IP addresses the node is reached at (repeatable)")
	ca.AddCommand(initCmd, issue)
	return ca
}
