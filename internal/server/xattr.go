package server

import (
	"context"
	"fmt"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/perm"
	"github.com/wheelfs/wheelfs/internal/store"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// xattrFlags as in setxattr(2).
const (
	xattrCreate  = 1
	xattrReplace = 2
)

// GetXattr implements wire.StorageServer.
func (s *Server) GetXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, aerr
	}
	resp := &wire.XattrResponse{}
	err := s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := perm.MayGetXattr(cred(req.Caller), attr(m), req.Name); err != nil {
			return err
		}
		if hidden(req.Name) {
			return fserr.ErrNoAttr
		}
		resp.Value, err = tx.Xattr(id, req.Name)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("getxattr %q: %w", req.Name, err)
	}
	return resp, nil
}

// ListXattr implements wire.StorageServer.
func (s *Server) ListXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, aerr
	}
	resp := &wire.XattrResponse{}
	c := cred(req.Caller)
	err := s.store.View(func(tx *store.Tx) error {
		if _, err := tx.Meta(id); err != nil {
			return err
		}
		names, err := tx.Xattrs(id)
		for _, n := range names {
			if perm.ListXattrVisible(c, n) && !hidden(n) {
				resp.Names = append(resp.Names, n)
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	return resp, nil
}

// SetXattr implements wire.StorageServer.
func (s *Server) SetXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	return s.changeXattr(ctx, req, false)
}

// RemoveXattr implements wire.StorageServer.
func (s *Server) RemoveXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	return s.changeXattr(ctx, req, true)
}

func (s *Server) changeXattr(ctx context.Context, req *wire.XattrRequest, remove bool) (*wire.XattrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, aerr
	}
	if req.Name == "" || len(req.Name) > 255 || hidden(req.Name) {
		return nil, fmt.Errorf("xattr name: %w", fserr.ErrRange)
	}
	if len(req.Value) > 64<<10 {
		return nil, fmt.Errorf("xattr value of %d bytes: %w", len(req.Value), fserr.ErrTooBig)
	}
	now := time.Now().UnixNano()
	err := s.update(ctx, 0, func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := perm.MaySetXattr(cred(req.Caller), attr(m), req.Name); err != nil {
			return err
		}
		_, getErr := tx.Xattr(id, req.Name)
		exists := getErr == nil
		switch {
		case remove && !exists, req.Flags&xattrReplace != 0 && !exists:
			return fserr.ErrNoAttr
		case req.Flags&xattrCreate != 0 && exists:
			return fserr.ErrExist
		}
		if remove {
			err = tx.RemoveXattr(id, req.Name)
		} else {
			err = tx.SetXattr(id, req.Name, req.Value)
		}
		if err != nil {
			return err
		}
		touch(m, now, false)
		return tx.PutMeta(m)
	})
	if err != nil {
		return nil, fmt.Errorf("xattr %q: %w", req.Name, err)
	}
	return &wire.XattrResponse{}, nil
}
