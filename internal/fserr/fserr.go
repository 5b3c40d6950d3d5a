// Package fserr defines the file-system error vocabulary shared by the
// server, the client core and the FUSE adapter. Errors are sentinel values
// wrapped with context; each maps to exactly one errno at the edges (FUSE
// and gRPC) through Errno and the gRPC helpers in this package.
package fserr

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// Error is a sentinel file-system error with a fixed errno.
type Error struct {
	msg   string
	errno syscall.Errno
}

func (e *Error) Error() string { return e.msg }

// Errno is the POSIX errno this error stands for.
func (e *Error) Errno() syscall.Errno { return e.errno }

func def(msg string, errno syscall.Errno) *Error { return &Error{msg: "wheelfs: " + msg, errno: errno} }

// The sentinels. Wrap them with fmt.Errorf("...: %w", ErrX) to add context.
var (
	ErrNotExist     = def("no such file or directory", syscall.ENOENT)
	ErrExist        = def("file exists", syscall.EEXIST)
	ErrNotDir       = def("not a directory", syscall.ENOTDIR)
	ErrIsDir        = def("is a directory", syscall.EISDIR)
	ErrNotEmpty     = def("directory not empty", syscall.ENOTEMPTY)
	ErrAccess       = def("permission denied", syscall.EACCES)
	ErrPerm         = def("operation not permitted", syscall.EPERM)
	ErrInvalid      = def("invalid argument", syscall.EINVAL)
	ErrTimeout      = def("timed out", syscall.ETIMEDOUT)
	ErrIO           = def("input/output error", syscall.EIO)
	ErrNoSpace      = def("no space left on device", syscall.ENOSPC)
	ErrNameTooLong  = def("file name too long", syscall.ENAMETOOLONG)
	ErrNoAttr       = def("no such attribute", syscall.ENODATA)
	ErrStale        = def("stale file handle", syscall.ESTALE)
	ErrCrossDevice  = def("cross-device link", syscall.EXDEV)
	ErrNotSupported = def("operation not supported", syscall.EOPNOTSUPP)
	ErrRange        = def("result too large", syscall.ERANGE)
	ErrTooManyLinks = def("too many links", syscall.EMLINK)
	ErrBadFD        = def("bad file descriptor", syscall.EBADF)
	ErrBusy         = def("device or resource busy", syscall.EBUSY)
	ErrTooBig       = def("file too large", syscall.EFBIG)
	ErrLoop         = def("too many levels of symbolic links", syscall.ELOOP)
	ErrArgTooBig    = def("argument list too long", syscall.E2BIG)
	ErrAgain        = def("resource temporarily unavailable", syscall.EAGAIN) // over a server's request rate
	ErrNotPrimary   = def("server is not the primary for this slice", syscall.EIO)
)

var all = []*Error{
	ErrNotExist, ErrExist, ErrNotDir, ErrIsDir, ErrNotEmpty, ErrAccess, ErrPerm,
	ErrInvalid, ErrTimeout, ErrIO, ErrNoSpace, ErrNameTooLong, ErrNoAttr, ErrStale,
	ErrCrossDevice, ErrNotSupported, ErrRange, ErrTooManyLinks, ErrBadFD, ErrBusy,
	ErrTooBig, ErrLoop, ErrArgTooBig, ErrAgain,
}

// FromErrno returns the sentinel for errno, or ErrIO when there is none.
func FromErrno(errno syscall.Errno) *Error {
	for _, e := range all {
		if e.errno == errno {
			return e
		}
	}
	return ErrIO
}

// Errno maps any error to an errno. Wrapped sentinels keep their errno;
// context deadlines become ETIMEDOUT; a raw syscall.Errno passes through;
// everything else is EIO. nil maps to 0.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var fe *Error
	if errors.As(err, &fe) {
		return fe.errno
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return syscall.ETIMEDOUT
	}
	if errors.Is(err, context.Canceled) {
		return syscall.EINTR
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}

// NameError is a name missing from a directory (or an attribute from an
// object), formatted only when read: misses are frequent on hot paths —
// every create looks its name up first — where fmt.Errorf cost more than
// the lookup.
type NameError struct {
	What string       // e.g. "lookup", "store: entry"
	Name string       // the name looked up
	In   fmt.Stringer // the directory or object
	Err  error        // the sentinel
}

func (e *NameError) Error() string {
	return fmt.Sprintf("%s %q in %v: %v", e.What, e.Name, e.In, e.Err)
}

func (e *NameError) Unwrap() error { return e.Err }
