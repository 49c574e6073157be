// Package errdefs defines the error kinds domain packages return, so that the
// CRI layer can map them to gRPC codes in one place.
package errdefs

import "errors"

// Sentinel kinds. Wrap them with fmt.Errorf("...: %w", ErrX) and check with
// errors.Is; the CRI layer turns them into the matching gRPC code.
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrUnavailable        = errors.New("unavailable")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	ErrResourceExhausted  = errors.New("resource exhausted")
)

// IsNotFound reports whether err is (or wraps) ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }
