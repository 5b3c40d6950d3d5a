package server

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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
func (s *Server) renameAcross(ctx context.Context, req *wire.RenameRequest) (*wire.RenameResponse, error) {
	resp, err := s.renameAcrossSteps(ctx, req)
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("rename %q to %q on another server: %w", req.SrcName, req.DstName, err))
	}
	return resp, nil
}

func (s *Server) renameAcrossSteps(ctx context.Context, req *wire.RenameRequest) (*wire.RenameResponse, error) {
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
		if sd, err = s.dirMeta(tx, src); err != nil {
			return err
		}
		se, err = tx.Entry(src, req.SrcName)
		return err
	})
	if err != nil {
		return nil, err
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
	err = s.update(ctx, 0, func(tx *store.Tx) error {
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
	})
	if err != nil {
		// Both names stay, both counted.
		return nil, fmt.Errorf("after adding %q: %w", req.DstName, err)
	}
	if removed && owner != "" {
		if err := s.dropLink(ctx, owner, id); err != nil {
			s.log.Warn("could not drop the link of a renamed file at its server", "id", id, "err", err)
		}
	}
	return &wire.RenameResponse{Replaced: added.Replaced}, nil
}

// refused reports whether a peer call's error is the peer's own answer
// (it ran and changed nothing), not a transport failure.
func refused(err error) bool {
	st, ok := status.FromError(err)
	return ok && (st.Code() == codes.FailedPrecondition || errors.Is(fserr.FromStatus(err), fserr.ErrNotPrimary))
}

// countLink adds one to the link count of id at its primary owner ("":
// this server).
func (s *Server) countLink(ctx context.Context, owner string, id oid.ID) error {
	if owner == "" {
		return s.update(ctx, 0, func(tx *store.Tx) error { return addNlink(tx, id, time.Now().UnixNano()) })
	}
	p, err := s.peer(ctx, owner)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PeerTimeout)
	defer cancel()
	_, err = p.AddLink(cctx, &wire.AddLinkRequest{Id: uint64(id), Count: true})
	return fserr.FromStatus(err)
}

// uncountLink takes back a link counted by countLink.
func (s *Server) uncountLink(ctx context.Context, owner string, id oid.ID) error {
	if owner != "" {
		return s.dropLink(ctx, owner, id)
	}
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	return s.update(ctx, 0, func(tx *store.Tx) error {
		dying = dying[:0]
		m, err := tx.Meta(id)
		if err != nil {
			return err
		}
		return s.unlinkObject(tx, m, time.Now().UnixNano(), &dying)
	})
}

// addNlink counts one more link to id, which must still have one.
func addNlink(tx *store.Tx, id oid.ID, now int64) error {
	m, err := tx.Meta(id)
	if err != nil {
		return err
	}
	if m.Nlink == 0 {
		return fmt.Errorf("link to removed object %v: %w", id, fserr.ErrNotExist)
	}
	m.Nlink++
	touch(m, now, false)
	return tx.PutMeta(m)
}

// AddLink implements wire.PeerServer: the destination's half of a rename
// between servers (see renameAcross), or, without a directory, counting a
// link to an object of this server.
func (p *peerServer) AddLink(ctx context.Context, req *wire.AddLinkRequest) (*wire.AddLinkResponse, error) {
	s := p.s
	if err := s.authPeer(ctx); err != nil {
		return nil, fserr.ToStatus(err)
	}
	resp, err := s.addLink(ctx, req)
	if err != nil {
		return nil, fserr.ToStatus(fmt.Errorf("add link %q to %v: %w", req.Name, oid.ID(req.Id), err))
	}
	return resp, nil
}

func (s *Server) addLink(ctx context.Context, req *wire.AddLinkRequest) (*wire.AddLinkResponse, error) {
	id := oid.ID(req.Id)
	now := time.Now().UnixNano()
	// The source decided who counts the link from its slice table; if
	// this server is not (or no longer) the object's primary it must
	// refuse, or the link would be counted nowhere.
	if req.Count {
		if err := s.primary(id); err != nil {
			return nil, err
		}
	}
	if req.Dir == 0 {
		if !req.Count {
			return nil, fmt.Errorf("add link: nothing to do: %w", fserr.ErrInvalid)
		}
		return &wire.AddLinkResponse{}, s.update(ctx, req.SyncLevel, func(tx *store.Tx) error { return addNlink(tx, id, now) })
	}
	dir := oid.ID(req.Dir)
	if err := s.primary(dir); err != nil {
		return nil, err
	}
	if req.Object == nil || req.Object.Id != req.Id || isDir(req.Object) {
		return nil, fmt.Errorf("add link: bad object: %w", fserr.ErrInvalid)
	}
	c := cred(req.Caller)
	// A name to be replaced whose object is elsewhere: its meta-data for
	// the permission check, and its link dropped there afterwards.
	var remote *wire.Meta
	var remoteOwner string
	var existing *wire.Entry
	_ = s.store.View(func(tx *store.Tx) error {
		existing, _ = tx.Entry(dir, req.Name)
		return nil
	})
	if existing != nil && existing.Id != req.Id && existing.Type != wire.Type_TYPE_DIR &&
		req.Flags&wire.RenameNoReplace == 0 && s.primary(oid.ID(existing.Id)) != nil {
		var err error
		if remote, remoteOwner, err = s.remoteMeta(ctx, oid.ID(existing.Id)); err != nil {
			return nil, err
		}
	}
	resp := &wire.AddLinkResponse{}
	var dying []oid.ID
	defer func() { s.buried(dying) }()
	dropRemote := false
	err := s.update(ctx, req.SyncLevel, func(tx *store.Tx) error {
		resp.Replaced, resp.Same, dropRemote = nil, false, false
		dd, err := s.dirMeta(tx, dir)
		if err != nil {
			return err
		}
		de, err := tx.Entry(dir, req.Name)
		if err != nil && fserr.Errno(err) != syscall.ENOENT {
			return err
		}
		var target *wire.Meta
		if de != nil {
			if de.Id == req.Id {
				resp.Same = true
				return nil
			}
			if req.Flags&wire.RenameNoReplace != 0 {
				return fmt.Errorf("%q: %w", req.Name, fserr.ErrExist)
			}
			if de.Type == wire.Type_TYPE_DIR {
				return fmt.Errorf("rename non-directory over directory %q: %w", req.Name, fserr.ErrIsDir)
			}
			switch {
			case s.primary(oid.ID(de.Id)) == nil:
				if target, err = tx.Meta(oid.ID(de.Id)); err != nil {
					return err
				}
			case remote != nil && remote.Id == de.Id:
				target, dropRemote = proto.Clone(remote).(*wire.Meta), true
			default:
				return fmt.Errorf("%q changed meanwhile: %w", req.Name, fserr.ErrNotPrimary)
			}
			if err := perm.MayRemove(c, attr(dd), attr(target)); err != nil {
				return err
			}
		} else if err := perm.MayCreate(c, attr(dd)); err != nil {
			return err
		}
		if req.Count {
			if err := addNlink(tx, id, now); err != nil {
				return err
			}
		}
		if target != nil {
			if !dropRemote {
				if err := s.unlinkObject(tx, target, now, &dying); err != nil {
					return err
				}
			}
			resp.Replaced = target
		}
		ne := &wire.Entry{Name: req.Name, Id: req.Id, Type: req.Object.Type, Version: 1}
		if de != nil {
			ne.Version = de.Version + 1
		}
		if err := tx.PutEntry(dir, ne); err != nil {
			return err
		}
		touch(dd, now, true)
		return tx.PutMeta(dd)
	})
	if err != nil {
		return nil, err
	}
	if dropRemote {
		if err := s.dropLink(ctx, remoteOwner, oid.ID(resp.Replaced.Id)); err != nil {
			s.log.Warn("could not unlink a replaced file on its server", "id", oid.ID(resp.Replaced.Id), "err", err)
		}
	}
	return resp, nil
}
