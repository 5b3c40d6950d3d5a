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

// Rename between directories on different servers (paper §5.4: not atomic
// with respect to failures). The source directory's primary moves a
// non-directory in three durable steps, each one transaction somewhere:
//
//  1. count the new link at the object's primary (here, or a third
//     server through AddLink without a directory), unless that is the
//     destination's primary, which counts it in step 2 (AddLink.count;
//     a server that is not the object's primary refuses);
//  2. the destination directory's primary adds the name (AddLink): it
//     checks the caller's permission there and replaces an existing name;
//  3. the name leaves the source directory, and the object loses the
//     link counted in step 1 (here, or by DropLink at its primary).
//
// nlink never counts fewer links than names, and the new name is durable
// before the old one goes, so a crash leaves the object named by the
// source, by the destination, or by both (a crash between 2 and 3), never
// by neither; both links are then counted and unlinking either name
// leaves a consistent file. A crash after step 1 or in step 3 leaves
// nlink one too high: the object outlives its last name (space, not
// data, is lost) until an fsck. A retried rename whose two names already
// name the object changes nothing, as rename(2) does for two hard links.
// Directories, exchanges and hard links between servers stay EXDEV:
// moving a directory would also change its parent pointer and the link
// counts of both directories, on up to three servers.

// renameAcross runs a rename whose destination directory another server
// is primary for; src is this server's.
func (s *Server) renameAcross(ctx context.Context, req *wire.RenameRequest, op *onceOp) (*wire.RenameResponse, error) {
	resp, err := s.renameAcrossSteps(ctx, req, op)
	if err != nil {
		return nil, fmt.Errorf("rename %q to %q on another server: %w", req.SrcName, req.DstName, err)
	}
	return resp, nil
}

func (s *Server) renameAcrossSteps(ctx context.Context, req *wire.RenameRequest, op *onceOp) (*wire.RenameResponse, error) {
	src, dst := oid.ID(req.SrcDir), oid.ID(req.DstDir)
	if req.Flags&wire.RenameExchange != 0 {
		return nil, fmt.Errorf("exchange across servers: %w", fserr.ErrCrossDevice)
	}
	dstOwner := s.primaryOf(dst.Slice())
	if dstOwner == "" || dstOwner == s.cfg.ID {
		return nil, fmt.Errorf("no primary for %v: %w", dst, fserr.ErrNotPrimary)
	}
	c := cred(req.Caller)
	var sd *wire.Meta
	var se *wire.Entry
	err := s.store.View(func(tx *store.Tx) (err error) {
		if op.lookup(tx) {
			return nil // done by an earlier attempt: no link counted or added again
		}
		if sd, err = s.dirMeta(tx, src); err != nil {
			return err
		}
		se, err = tx.Entry(src, req.SrcName)
		return err
	})
	if err != nil {
		return nil, s.settled(ctx, err, src)
	}
	if op.replayed() {
		return op.resp.(*wire.RenameResponse), op.settle(ctx, 0)
	}
	if se.Type == wire.Type_TYPE_DIR {
		return nil, fmt.Errorf("moving a directory across servers: %w", fserr.ErrCrossDevice)
	}
	id := oid.ID(se.Id)
	owner := "" // the object's primary; "" is this server
	var child *wire.Meta
	if s.primary(id) == nil {
		child, err = s.primaryMeta(id)
	} else {
		child, owner, err = s.remoteMeta(ctx, id)
	}
	if err != nil {
		return nil, err
	}
	if err := perm.MayRemove(c, attr(sd), attr(child)); err != nil {
		return nil, err
	}

	// Step 1.
	counted := owner != dstOwner
	if counted {
		if err := s.countLink(ctx, owner, id); err != nil {
			return nil, err
		}
	}
	uncount := func() {
		if !counted {
			return
		}
		if err := s.uncountLink(ctx, owner, id); err != nil {
			s.log.Warn("could not take back a link counted for a failed rename", "id", id, "err", err)
		}
	}

	// Step 2.
	p, err := s.peer(ctx, dstOwner)
	if err != nil {
		uncount()
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	added, err := p.AddLink(cctx, &wire.AddLinkRequest{Caller: req.Caller, Dir: uint64(dst), Name: req.DstName,
		Id: uint64(id), Object: child, Flags: req.Flags, Count: !counted})
	cancel()
	if err != nil {
		// Unless the destination refused, it is unknown whether the name
		// was added: the link counted in step 1 then stays (too many links
		// counted, never too few).
		if refused(err) {
			uncount()
		}
		return nil, fserr.FromStatus(err)
	}
	if added.Same {
		uncount()
		return &wire.RenameResponse{}, nil
	}
	if h := s.cfg.AfterRenameLink; h != nil {
		if err := h(ctx); err != nil {
			return nil, err
		}
	}

	// Step 3.
	now := time.Now().UnixNano()
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	removed := false
	op.setAnswer(&wire.RenameResponse{Replaced: added.Replaced})
	err = s.update(ctx, 0, op.wrap(func(tx *store.Tx) error {
		removed = false
		sd, err := s.dirMeta(tx, src)
		if err != nil {
			return err
		}
		cur, err := tx.Entry(src, req.SrcName)
		if err != nil || cur.Id != se.Id {
			// Removed or replaced meanwhile, and its link dropped then.
			return nil
		}
		if err := tx.DeleteEntry(src, req.SrcName); err != nil {
			return err
		}
		removed = true
		touch(sd, now, true)
		if err := tx.PutMeta(sd); err != nil {
			return err
		}
		if owner != "" {
			return nil
		}
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		return s.unlinkObject(tx, m, now, &dying)
	}))
	if err == nil && op.replayed() {
		return op.resp.(*wire.RenameResponse), op.settle(ctx, 0)
	}
	if err != nil {
		// Both names stay, both counted.
		return nil, fmt.Errorf("after adding %q: %w", req.DstName, err)
	}
	if removed && owner != "" {
		if err := s.dropLink(ctx, owner, id, false); err != nil {
			s.log.Warn("could not drop the link of a renamed file at its server", "id", id, "err", err)
		}
	}
	return &wire.RenameResponse{Replaced: added.Replaced}, nil
}
