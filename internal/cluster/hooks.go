package cluster

import (
	"github.com/wheelfs/wheelfs/internal/deploy"
)

// applyHooks places n in the cluster: its roles, the shared CA and the
// shaped network.
func applyHooks(c *Cluster, n *Node, cfg *deploy.Config) {
	cfg.Roles = deploy.RoleClient
	if n.server {
		cfg.Roles |= deploy.RoleServer
	}
	cfg.CADir = c.caDir
	cfg.InitCA = false
	cfg.Network = c.Network
	cfg.Server.OnLock = c.locks.record
}

func crashHost(h *deploy.Host)  { h.Crash() }
func pauseHost(h *deploy.Host)  { h.Pause() }
func resumeHost(h *deploy.Host) { h.Resume() }

// stopHost stops h in order when the configuration service can answer,
// and as a crash when it cannot (its lock releases would wait in vain).
func stopHost(h *deploy.Host, quorum bool) {
	if quorum {
		h.Close()
	} else {
		h.Crash()
	}
}
