package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/wheelfs/wheelfs/internal/attrs"
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

// Bounds of the summary of an object's extended attributes that travels
// with a lease on it: values of up to summaryValueMax bytes, and
// summaryValuesMax in all, are included; a larger one the client asks for
// once. An object whose names alone exceed summaryNamesMax gets no summary
// (the client then asks every time).
const (
	summaryValueMax  = 256
	summaryValuesMax = 4 << 10
	summaryNamesMax  = 8 << 10
)

// xattrSummary describes m's extended attributes, read in the transaction
// that read m, for a lease granted to c: every visible name, and the
// values c may read that are small enough. Hidden names (tombstones) are
// skipped without being read: they start with a NUL, which no name a
// client gives can contain.
func xattrSummary(tx *store.Tx, c *wire.Caller, m *wire.Meta) *wire.XattrSummary {
	sum := &wire.XattrSummary{Version: m.Version}
	cr, a := cred(c), attr(m)
	names, values := 0, 0
	whole := true
	tx.EachXattr(oid.ID(m.Id), "\x01", func(n string, v []byte) bool {
		if names += len(n); names > summaryNamesMax {
			whole = false
			return false
		}
		x := &wire.Xattr{Name: n, Omitted: true}
		if len(v) <= summaryValueMax && values+len(v) <= summaryValuesMax && perm.MayGetXattr(cr, a, n) == nil {
			x.Value, x.Omitted = bytes.Clone(v), false
			values += len(v)
		}
		sum.Attrs = append(sum.Attrs, x)
		return true
	})
	if !whole {
		return nil
	}
	// The ACLs live in m, so they are always known whole (and anyone
	// may read them).
	for _, n := range attrs.ACLNames(m) {
		v, _ := attrs.ACLXattr(m, n)
		sum.Attrs = append(sum.Attrs, &wire.Xattr{Name: n, Value: v})
	}
	return sum
}

// leasedMeta reads id's meta-data and, when ms (a lease just granted to
// c) is non-zero, the summary of its extended attributes with it.
func (s *Server) leasedMeta(c *wire.Caller, id oid.ID, ms uint32) (m *wire.Meta, sum *wire.XattrSummary, err error) {
	m, sum, _, err = s.leasedMetaData(c, id, ms, 0)
	return m, sum, err
}

// leasedMetaData is leasedMeta that also reads, for a file of at most
// inlineMax bytes (0: none) that c may read, its blocks (FileData) at
// the same version.
func (s *Server) leasedMetaData(c *wire.Caller, id oid.ID, ms uint32, inlineMax uint64) (m *wire.Meta, sum *wire.XattrSummary, fd *wire.FileData, err error) {
	err = s.store.View(func(tx *store.Tx) error {
		if m, err = tx.Meta(id); err != nil {
			return err
		}
		if ms > 0 {
			sum = xattrSummary(tx, c, m)
		}
		if inlineMax > 0 && m.Size <= inlineMax {
			fd, err = fileData(tx, c, m)
		}
		return err
	})
	if err == nil {
		s.inline(fd, m.Size, inlineMax)
	}
	return m, sum, fd, err
}

// GetXattr implements wire.StorageServer. Like GetAttr it leases the
// object's meta-data, with its xattr summary, so that the client answers
// the next questions itself; with absent_ok a missing attribute is an
// answer (absent) rather than ENODATA, so that it comes with the lease.
func (s *Server) GetXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, aerr
	}
	resp := &wire.XattrResponse{LeaseMs: s.leases.grant(req.Caller, id)}
	err := s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := perm.MayGetXattr(cred(req.Caller), attr(m), req.Name); err != nil {
			return err
		}
		resp.Meta = m
		if resp.LeaseMs > 0 {
			resp.Xattrs = xattrSummary(tx, req.Caller, m)
		}
		switch {
		case hidden(req.Name):
			err = fserr.ErrNoAttr
		case perm.IsACLXattr(req.Name):
			var ok bool
			if resp.Value, ok = attrs.ACLXattr(m, req.Name); !ok {
				err = fserr.ErrNoAttr
			}
		default:
			resp.Value, err = tx.Xattr(id, req.Name)
		}
		if errors.Is(err, fserr.ErrNoAttr) && req.AbsentOk {
			resp.Absent, err = true, nil
		}
		return err
	})
	err = s.settled(ctx, err, id)
	if err != nil {
		return nil, fmt.Errorf("getxattr %q: %w", req.Name, err)
	}
	return resp, nil
}

// ListXattr implements wire.StorageServer; it leases as GetXattr does.
func (s *Server) ListXattr(ctx context.Context, req *wire.XattrRequest) (*wire.XattrResponse, error) {
	id := oid.ID(req.Id)
	ctx, aerr := s.admit(ctx, req.Caller, id)
	if aerr != nil {
		return nil, aerr
	}
	resp := &wire.XattrResponse{LeaseMs: s.leases.grant(req.Caller, id)}
	c := cred(req.Caller)
	err := s.store.View(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		resp.Meta = m
		if resp.LeaseMs > 0 {
			resp.Xattrs = xattrSummary(tx, req.Caller, m)
		}
		names, err := tx.Xattrs(id)
		names = append(names, attrs.ACLNames(m)...)
		for _, n := range names {
			if perm.ListXattrVisible(c, n) && !hidden(n) {
				resp.Names = append(resp.Names, n)
			}
		}
		return err
	})
	err = s.settled(ctx, err, id)
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
	if req.Name == "" || len(req.Name) > wire.XattrNameMax || hidden(req.Name) {
		return nil, fmt.Errorf("xattr name: %w", fserr.ErrRange)
	}
	if len(req.Value) > wire.XattrSizeMax {
		return nil, fmt.Errorf("xattr value of %d bytes: %w", len(req.Value), fserr.ErrArgTooBig)
	}
	resp := &wire.XattrResponse{}
	op := s.once(ctx, req.Caller, id, resp)
	now := time.Now().UnixNano()
	err := s.update(ctx, 0, op.wrap(func(tx *store.Tx) error {
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		if err := perm.MaySetXattr(cred(req.Caller), attr(m), req.Name); err != nil {
			return err
		}
		if perm.IsACLXattr(req.Name) {
			// An ACL is meta-data: it replicates, and revokes leases,
			// with m. Like Linux, the flags do not apply to it.
			if err := attrs.SetACLXattr(cred(req.Caller), m, req.Name, req.Value, remove); err != nil {
				return err
			}
			touch(m, now, false)
			return tx.PutMeta(m)
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
		} else if err = xattrRoom(tx, id, req.Name, req.Value); err == nil {
			err = tx.SetXattr(id, req.Name, req.Value)
		}
		if err != nil {
			return err
		}
		touch(m, now, false)
		return tx.PutMeta(m)
	}))
	if err == nil {
		err = op.settle(ctx, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("xattr %q: %w", req.Name, err)
	}
	return resp, nil
}
