package server

import (
	"context"
	"fmt"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// loginNode is the node a login, renewal or logout is for: the caller's
// certificate name. Nodes whose uids are trusted have nothing to log in.
func (s *Server) loginNode(ctx context.Context) (string, error) {
	if s.cfg.Users == nil {
		return "", fmt.Errorf("this server trusts client uids (--trust-client-uids); no login needed: %w", fserr.ErrNotSupported)
	}
	node, trusted := s.clientNode(ctx)
	if trusted {
		return "", fmt.Errorf("node %q runs a server or shares its process: its uids are trusted, no login needed: %w", node, fserr.ErrNotSupported)
	}
	return node, nil
}

// LoginChallenge implements wire.StorageServer.
func (s *Server) LoginChallenge(ctx context.Context, req *wire.LoginChallengeRequest) (*wire.LoginChallengeResponse, error) {
	node, err := s.loginNode(ctx)
	if err != nil {
		return nil, err
	}
	return s.cfg.Users.Challenge(node, req.Uid, req.User)
}

// Login implements wire.StorageServer.
func (s *Server) Login(ctx context.Context, req *wire.LoginRequest) (*wire.LoginResponse, error) {
	node, err := s.loginNode(ctx)
	if err != nil {
		return nil, err
	}
	return s.cfg.Users.Login(ctx, node, req)
}

// RenewSession implements wire.StorageServer.
func (s *Server) RenewSession(ctx context.Context, req *wire.SessionRequest) (*wire.LoginResponse, error) {
	node, err := s.loginNode(ctx)
	if err != nil {
		return nil, err
	}
	return s.cfg.Users.Renew(ctx, node, req.Uid)
}

// Logout implements wire.StorageServer.
func (s *Server) Logout(ctx context.Context, req *wire.SessionRequest) (*wire.LogoutResponse, error) {
	node, err := s.loginNode(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Users.Logout(ctx, node, req.Uid); err != nil {
		return nil, err
	}
	return &wire.LogoutResponse{}, nil
}
