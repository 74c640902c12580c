package codec

import "errors"

// PermanentPrefix starts the message of every error that says a message can
// never be published (too large, an invalid topic or event ID, a payload
// that cannot be enveloped): the same message fails the same way every time.
const PermanentPrefix = "permanent failure: "

// permanentError marks an error as permanent for this message.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return PermanentPrefix + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent for the message it concerns.
func Permanent(err error) error { return &permanentError{err: err} }

// IsPermanent reports whether err (or an error it wraps) was marked by
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
