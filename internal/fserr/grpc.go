package fserr

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errnoPrefix marks a status message that carries an errno: "errno=2: text".
const errnoPrefix = "errno="

// ToStatus converts err to a gRPC status error at the server edge. File-system
// errors travel as codes.FailedPrecondition with the errno in the message,
// so the client reconstructs the same sentinel (ErrNotPrimary as
// Unavailable, which clients retry elsewhere; ErrAgain as
// ResourceExhausted, gRPC's code for a rate limit).
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !isFS(err) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	code := codes.FailedPrecondition
	switch {
	case errors.Is(err, ErrNotPrimary):
		code = codes.Unavailable
	case errors.Is(err, ErrAgain):
		code = codes.ResourceExhausted
	}
	return status.Error(code, errnoPrefix+strconv.Itoa(int(Errno(err)))+": "+err.Error())
}

func isFS(err error) bool {
	var fe *Error
	return errors.As(err, &fe)
}

// FromStatus converts an error returned by a gRPC call back into a wrapped
// sentinel, keeping the server's text as context. Transport failures become
// ErrTimeout (deadline) or ErrIO (unreachable), wrapping the original.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", msg, ErrTimeout)
	case codes.Canceled:
		return fmt.Errorf("%s: %w", msg, context.Canceled)
	case codes.FailedPrecondition, codes.Unavailable, codes.ResourceExhausted:
		if n, text, ok := parseErrno(msg); ok {
			if st.Code() == codes.Unavailable {
				return fmt.Errorf("%s: %w", text, ErrNotPrimary)
			}
			return fmt.Errorf("%s: %w", text, FromErrno(n))
		}
	}
	return fmt.Errorf("rpc: %s: %w", msg, ErrIO)
}

func parseErrno(msg string) (syscall.Errno, string, bool) {
	if len(msg) < len(errnoPrefix) || msg[:len(errnoPrefix)] != errnoPrefix {
		return 0, "", false
	}
	rest := msg[len(errnoPrefix):]
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	n, err := strconv.Atoi(rest[:i])
	if err != nil {
		return 0, "", false
	}
	text := rest[i:]
	if len(text) >= 2 && text[:2] == ": " {
		text = text[2:]
	}
	return syscall.Errno(n), text, true
}
