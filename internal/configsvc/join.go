package configsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// ErrMemberExists means a started member already uses the name or peer URL
// being added.
var ErrMemberExists = errors.New("configsvc: member already in the cluster")

// AddMember adds a member called name that will listen for peers at
// peerURL to the etcd cluster (clientv3 MemberAdd), and returns the
// initial-cluster string ("name=peerURL,...") to start it with
// initial-cluster-state "existing". A member added earlier with the same
// peer URL that never started is reused, so an interrupted join can be
// retried. While the cluster refuses the change because an earlier new
// member has not caught up yet (etcd's strict reconfiguration check), the
// call is retried until ctx ends.
func (s *EtcdService) AddMember(ctx context.Context, name, peerURL string) (string, error) {
	if s.isClosed() {
		return "", ErrClosed
	}
	for {
		cctx, cancel := s.rpcCtx(ctx)
		list, err := s.cli.MemberList(cctx)
		cancel()
		if err != nil {
			return "", fmt.Errorf("configsvc: add member %s: list members: %w", name, err)
		}
		var newID uint64
		var pending string // another added member that has not started yet
		for _, m := range list.Members {
			switch {
			case !slices.Contains(m.PeerURLs, peerURL) && m.Name == "":
				pending = strings.Join(m.PeerURLs, ",")
			case slices.Contains(m.PeerURLs, peerURL) && m.Name == "":
				newID = m.ID // added before, never started
			case slices.Contains(m.PeerURLs, peerURL) || (m.Name == name && name != ""):
				return "", fmt.Errorf("%w: %q (peer URLs %v); remove it first or restart it on its own data directory",
					ErrMemberExists, m.Name, m.PeerURLs)
			}
		}
		members := list.Members
		if pending != "" && newID == 0 {
			// One join at a time: the new member's initial cluster must
			// name every member, and an unstarted one has no name yet.
			s.log.Info("waiting for an earlier new member to start", "member", name, "pending", pending)
			select {
			case <-ctx.Done():
				return "", fmt.Errorf("configsvc: add member %s: the member at %s was added but never started (remove it with etcdctl member remove): %w",
					name, pending, ctx.Err())
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		if newID == 0 {
			cctx, cancel := s.rpcCtx(ctx)
			resp, err := s.cli.MemberAdd(cctx, []string{peerURL})
			cancel()
			if err != nil {
				if retryableReconfig(err) {
					s.log.Info("cluster not ready for a new member yet; retrying", "member", name, "err", err)
					select {
					case <-ctx.Done():
						return "", fmt.Errorf("configsvc: add member %s: %w (last: %v)", name, ctx.Err(), err)
					case <-time.After(500 * time.Millisecond):
					}
					continue
				}
				return "", fmt.Errorf("configsvc: add member %s at %s: %w", name, peerURL, err)
			}
			newID, members = resp.Member.ID, resp.Members
		}
		var parts []string
		for _, m := range members {
			n := m.Name
			if m.ID == newID {
				n = name
			}
			for _, u := range m.PeerURLs {
				parts = append(parts, n+"="+u)
			}
		}
		s.log.Info("member added", "member", name, "peer", peerURL)
		return strings.Join(parts, ","), nil
	}
}

// retryableReconfig reports whether etcd refused a membership change only
// for now: an earlier new member has not started or caught up yet.
func retryableReconfig(err error) bool {
	for _, e := range []error{rpctypes.ErrUnhealthy, rpctypes.ErrGRPCUnhealthy,
		rpctypes.ErrMemberNotEnoughStarted, rpctypes.ErrGRPCMemberNotEnoughStarted} {
		if errors.Is(err, e) {
			return true
		}
	}
	msg := err.Error()
	return strings.Contains(msg, "unhealthy cluster") || strings.Contains(msg, "not enough started members")
}
