package auth

import (
	"context"
	"errors"
	"time"

	"github.com/wheelfs/wheelfs/internal/fserr"
)

// ErrUntrusted means the users file, or its directory, could be changed by
// someone other than root; it is then ignored (nobody may log in).
var ErrUntrusted = errors.New("auth: users file is not owned by root or is writable by others")

// ReadUsersFunc reads the users file if its version differs from since:
// it returns the new contents and version, or nil data when unchanged.
// fserr.ErrNotExist means there is no users file.
type ReadUsersFunc func(ctx context.Context, since uint64) (data []byte, version uint64, err error)

// FollowUsers keeps g's users equal to the users file: it asks read every
// period (cheap: the reader's client core answers from its leased cache
// until the file changes) and parses the file again when its version
// changed. A missing, untrusted or malformed file leaves nobody able to
// log in; a file that cannot be read for a while (network) keeps the last
// users. It returns when ctx ends.
func FollowUsers(ctx context.Context, g *Guard, read ReadUsersFunc, period time.Duration) {
	var version uint64
	loaded := false
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, max(period, 5*time.Second))
		data, v, err := read(rctx, version)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, fserr.ErrNotExist) || errors.Is(err, ErrUntrusted):
			if loaded || version == 0 {
				if errors.Is(err, ErrUntrusted) {
					g.log.Warn("users file ignored", "path", UsersPath, "err", err)
				}
				g.SetUsers(&Users{})
				loaded, version = false, 1<<63 // reread as soon as it exists again
			}
		case err != nil:
			g.log.Warn("users file unreadable; keeping the last one", "path", UsersPath, "err", err)
		case data != nil:
			us, perr := ParseUsers(data)
			if perr != nil {
				g.log.Error("users file malformed; nobody may log in until it is fixed", "path", UsersPath, "version", v, "err", perr)
				us = &Users{}
			}
			g.SetUsers(us)
			loaded, version = true, v
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
