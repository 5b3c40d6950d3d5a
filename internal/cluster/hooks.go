package cluster

import (
	"os"
	"path/filepath"

	"github.com/wheelfs/wheelfs/internal/deploy"
	"github.com/wheelfs/wheelfs/internal/pki"
)

// applyHooks sets what deploy needs to place n in the cluster.
func applyHooks(c *Cluster, n *Node, cfg *deploy.Config) {}

// prepareDir gives a new node the deployment CA.
func prepareDir(c *Cluster, n *Node) error {
	dst := filepath.Join(n.Dir, "ca")
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	for _, f := range []string{pki.CACertFile, pki.CAKeyFile} {
		b, err := os.ReadFile(filepath.Join(c.caDir, f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func crashHost(h *deploy.Host) {
	h.Server.Halt()
	h.Close()
}

func pauseHost(h *deploy.Host)  { h.Server.Freeze() }
func resumeHost(h *deploy.Host) { h.Server.Thaw() }
func stopHost(h *deploy.Host)   { h.Close() }
