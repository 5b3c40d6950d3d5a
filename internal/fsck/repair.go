package fsck

import (
	"context"
	"errors"
	"fmt"

	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// lostFound is the directory leaked objects are named in
// (server.LostFound; fsck does not import the server).
const lostFound = "lost+found"

// repair applies a repair for every finding, in an order where one does
// not undo another: entries dropped first, then link counts, then leaked
// objects named, then replicas and copies. Each records its outcome in
// the finding.
func (r *run) repair(ctx context.Context, sc *scanned, found []Finding) {
	order := []Kind{Dangling, LinkCount, Leaked, ReplicaDiffers, StaleCopy}
	total, done := len(found), 0
	r.progress("repair", done, total)
	lf := oid.ID(0) // /lost+found, once known
	for _, k := range order {
		for i := range found {
			f := &found[i]
			if f.Kind != k {
				continue
			}
			var err error
			switch k {
			case Dangling:
				err = r.apply(ctx, sc, f.dir.Slice(), "", &wire.FsckRepairRequest{Kind: wire.FsckRepairKind_FSCK_DROP_ENTRY,
					Dir: uint64(f.dir), Name: f.Name, Id: uint64(f.id)})
			case LinkCount:
				err = r.apply(ctx, sc, f.id.Slice(), "", &wire.FsckRepairRequest{Kind: wire.FsckRepairKind_FSCK_SET_LINKS,
					Id: uint64(f.id), Nlink: f.Want, Version: f.version})
			case Leaked:
				if lf == 0 {
					lf, err = r.lostFound(ctx, sc)
				}
				if err == nil {
					err = r.adopt(ctx, sc, lf, f)
				}
			case ReplicaDiffers:
				// The objects go whole: a directory's entries may differ
				// where the snapshot's digest (meta-data) agrees.
				var ids []uint64
				for _, id := range f.differ[:min(len(f.differ), wire.MaxListEntries)] {
					ids = append(ids, uint64(id))
				}
				err = r.apply(ctx, sc, oid.Slice(f.Slice), "", &wire.FsckRepairRequest{Kind: wire.FsckRepairKind_FSCK_RESYNC,
					Slice: f.Slice, Server: f.Server, Ids: ids})
			case StaleCopy:
				if _, ok := sc.table.Slices[oid.Slice(f.Slice)]; !ok {
					err = errors.New("left alone: the slice is not in the slice table (its copies may be the only ones)")
					break
				}
				err = r.apply(ctx, sc, oid.Slice(f.Slice), f.Server, &wire.FsckRepairRequest{Kind: wire.FsckRepairKind_FSCK_DROP_COPY,
					Slice: f.Slice})
			}
			if err != nil {
				f.RepairError = err.Error()
				r.log.Warn("repair failed", "kind", f.Kind, "slice", f.Slice, "id", f.ID, "err", err)
			} else {
				f.Repaired = true
			}
			done++
			r.progress("repair", done, total)
		}
	}
}

// errMoved is a repair the server did not apply: the state had changed
// since the scans.
var errMoved = errors.New("changed since the scan: not repaired, run fsck again")

// apply sends one repair to server sv, or to the primary (lock holder)
// of slice sl if sv is empty.
func (r *run) apply(ctx context.Context, sc *scanned, sl oid.Slice, sv string, req *wire.FsckRepairRequest) error {
	resp, err := r.call(ctx, sc, sl, sv, req)
	if err != nil {
		return err
	}
	if !resp.Changed {
		return errMoved
	}
	return nil
}

func (r *run) call(ctx context.Context, sc *scanned, sl oid.Slice, sv string, req *wire.FsckRepairRequest) (*wire.FsckRepairResponse, error) {
	if sv == "" {
		e, ok := sc.table.Slices[sl]
		if !ok || e.Holder == "" {
			// A slice made during the repairs (/lost+found's), or a
			// primary changed: read the table again.
			tctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
			t, err := r.d.Table(tctx)
			cancel()
			if err != nil {
				return nil, err
			}
			sc.table = t
			if e, ok = t.Slices[sl]; !ok || e.Holder == "" {
				return nil, fmt.Errorf("slice %d has no primary", sl)
			}
		}
		sv = e.Holder
	}
	p, err := r.d.Peer(ctx, sv)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
	defer cancel()
	resp, err := p.FsckRepair(cctx, req)
	if err != nil {
		return nil, fmt.Errorf("%v at %s: %w", req.Kind, sv, err)
	}
	return resp, nil
}

// lostFound returns /lost+found's ID, asking the root's primary to make
// it if the scan did not see it.
func (r *run) lostFound(ctx context.Context, sc *scanned) (oid.ID, error) {
	if l := sc.auth[oid.RootSlice]; l != nil {
		if root := l.byID[oid.Root]; root != nil {
			for _, e := range root.Entries {
				if e.Name == lostFound {
					if e.Type != wire.Type_TYPE_DIR {
						return 0, fmt.Errorf("/%s is not a directory", lostFound)
					}
					return oid.ID(e.Id), nil
				}
			}
		}
	}
	resp, err := r.call(ctx, sc, oid.RootSlice, "", &wire.FsckRepairRequest{Kind: wire.FsckRepairKind_FSCK_LOST_FOUND})
	if err != nil {
		return 0, err
	}
	return oid.ID(resp.Id), nil
}

// adopt names leaked object f /lost+found/#<id>: the name first (at the
// directory's primary), then the link count (and a directory's parent)
// at the object's. A failure in between leaves a link count an fsck
// fixes, never a name lost.
func (r *run) adopt(ctx context.Context, sc *scanned, lf oid.ID, f *Finding) error {
	name := fmt.Sprintf("#%016x", uint64(f.id))
	resp, err := r.call(ctx, sc, lf.Slice(), "", &wire.FsckRepairRequest{Kind: wire.FsckRepairKind_FSCK_ADD_ENTRY,
		Dir: uint64(lf), Name: name, Id: uint64(f.id), Type: f.typ})
	if err != nil {
		return err
	}
	if !resp.Changed {
		return fmt.Errorf("/%s/%s exists: %w", lostFound, name, errMoved)
	}
	req := &wire.FsckRepairRequest{Kind: wire.FsckRepairKind_FSCK_SET_LINKS, Id: uint64(f.id), Nlink: f.Want, Version: f.version}
	if f.typ == wire.Type_TYPE_DIR {
		req.Parent = uint64(lf)
	}
	return r.apply(ctx, sc, f.id.Slice(), "", req)
}
