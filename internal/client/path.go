package client

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"syscall"

	"github.com/wheelfs/wheelfs/internal/cue"
	"github.com/wheelfs/wheelfs/internal/fserr"
	"github.com/wheelfs/wheelfs/internal/oid"
	"github.com/wheelfs/wheelfs/internal/wire"
)

// Resolved is a path resolved to an object and the cues in force for it.
type Resolved struct {
	Parent oid.ID // directory holding the last component (Root for "/")
	Name   string // last ordinary component ("" for the root)
	Cues   cue.Set
	Meta   *wire.Meta // nil when the last component does not exist
}

// ParseCues parses the cues of a path, logging a malformed one by name
// (the caller reports EINVAL).
func (f *FS) ParseCues(path string) ([]cue.Component, cue.Set, error) {
	comps, final, err := cue.Split(path)
	if err != nil {
		f.log.Warn("malformed cue", slog.String("path", path), slog.Any("err", err))
		return nil, cue.Set{}, fmt.Errorf("%v: %w", err, fserr.ErrInvalid)
	}
	return comps, final, nil
}

// Resolve walks path from the root without following symlinks in the last
// component. Cue components apply to everything after them. A missing last
// component is not an error: Meta is nil.
func (f *FS) Resolve(ctx context.Context, u User, path string) (*Resolved, error) {
	comps, final, err := f.ParseCues(path)
	if err != nil {
		return nil, err
	}
	r := &Resolved{Parent: oid.Root, Cues: final}
	if len(comps) == 0 {
		m, err := f.getAttrMeta(ctx, u, final, oid.Root)
		if err != nil {
			return nil, err
		}
		r.Meta = m
		return r, nil
	}
	dir := oid.Root
	for i, c := range comps {
		m, err := f.lookupMeta(ctx, u, c.Cues, dir, c.Name)
		last := i == len(comps)-1
		if last {
			r.Parent, r.Name = dir, c.Name
			if err != nil && fserr.Errno(err) == syscall.ENOENT {
				return r, nil
			}
			if err != nil {
				return nil, err
			}
			r.Meta = m
			return r, nil
		}
		if err != nil {
			return nil, err
		}
		if m.Type != wire.Type_TYPE_DIR {
			return nil, fmt.Errorf("%q: %w", c.Name, fserr.ErrNotDir)
		}
		dir = oid.ID(m.Id)
	}
	return r, nil
}

// WriteFile creates or truncates path and writes data, as a Go-API
// convenience (tests, tools).
func (f *FS) WriteFile(ctx context.Context, u User, path string, data []byte, mode uint32) error {
	r, err := f.Resolve(ctx, u, path)
	if err != nil {
		return err
	}
	var h *Handle
	if r.Meta == nil {
		h, _, err = f.CreateOpen(ctx, u, r.Cues, r.Parent, r.Name, CreateArgs{Mode: mode}, syscall.O_CREAT|syscall.O_WRONLY|syscall.O_TRUNC)
	} else {
		h, _, err = f.Open(ctx, u, r.Cues, oid.ID(r.Meta.Id), syscall.O_WRONLY|syscall.O_TRUNC)
	}
	if err != nil {
		return err
	}
	defer h.Release(ctx)
	if _, err := h.Write(ctx, data, 0); err != nil {
		return err
	}
	return h.Flush(ctx)
}

// ReadFile returns the whole contents of path.
func (f *FS) ReadFile(ctx context.Context, u User, path string) ([]byte, error) {
	r, err := f.Resolve(ctx, u, path)
	if err != nil {
		return nil, err
	}
	if r.Meta == nil {
		return nil, fmt.Errorf("%s: %w", path, fserr.ErrNotExist)
	}
	h, m, err := f.Open(ctx, u, r.Cues, oid.ID(r.Meta.Id), syscall.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer h.Release(ctx)
	buf := make([]byte, m.Size)
	n, err := h.Read(ctx, buf, 0)
	if err != nil && err != io.EOF {
		return nil, err
	}
	return buf[:n], nil
}

// Mkdir creates the directory path.
func (f *FS) Mkdir(ctx context.Context, u User, path string, mode uint32) (*Attr, error) {
	r, err := f.Resolve(ctx, u, path)
	if err != nil {
		return nil, err
	}
	if r.Meta != nil {
		return nil, fmt.Errorf("%s: %w", path, fserr.ErrExist)
	}
	return f.Create(ctx, u, r.Cues, r.Parent, r.Name, CreateArgs{Type: wire.Type_TYPE_DIR, Mode: mode})
}
