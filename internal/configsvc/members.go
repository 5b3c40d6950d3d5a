package configsvc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Members implements Service with the etcd cluster API: MemberList, then a
// Status call on each member's first client URL (in parallel, each bounded
// by RPCTimeout) to find the leader and the members that answer.
func (s *EtcdService) Members(ctx context.Context) ([]Member, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	cctx, cancel := s.rpcCtx(ctx)
	defer cancel()
	resp, err := s.cli.MemberList(cctx)
	if err != nil {
		return nil, fmt.Errorf("configsvc: list members: %w", err)
	}
	out := make([]Member, len(resp.Members))
	var wg sync.WaitGroup
	for i, m := range resp.Members {
		out[i] = Member{Name: m.Name, ClientURLs: m.ClientURLs, PeerURLs: m.PeerURLs, Learner: m.IsLearner}
		if len(m.ClientURLs) == 0 { // added but not started yet
			continue
		}
		wg.Go(func() {
			s.endpointsMu.RLock() // see endpointsMu; bounded by RPCTimeout
			st, err := s.cli.Status(cctx, m.ClientURLs[0])
			s.endpointsMu.RUnlock()
			if err != nil {
				s.log.Debug("member status", "member", m.Name, "err", err)
				return
			}
			out[i].Reachable = true
			out[i].Leader = st.Leader == m.ID
		})
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
