// Package format names the format version of a durable file or record and
// the refusal a build gives to a version newer than it reads. Data in a
// newer format is intact, only this build cannot read it: it is refused
// whole, never parked or repaired as damage.
package format

import (
	"errors"
	"fmt"
)

// ErrNewer marks data written in a format newer than this build reads.
var ErrNewer = errors.New("written in a newer format")

// NewerError names what was found in a newer format, where, the versions
// this build reads, and what to do. It is errors.Is ErrNewer.
type NewerError struct {
	File  string // the file's path, or the SQL table
	What  string // what carries the version: "outbox", "outbox record seq 7", ...
	Found uint64 // the version found
	Reads uint64 // the newest version this build reads (it reads 1 to Reads)
}

func (e *NewerError) Error() string {
	return fmt.Sprintf("%s in %s is %v: format version %d, and this build reads versions 1 to %d; refusing to use it (nothing was moved aside): run the release that wrote it, or a newer one (if no newer release ever wrote it, it is damaged: see \"Damaged files\" in docs/operations.md)",
		e.What, e.File, ErrNewer, e.Found, e.Reads)
}

func (e *NewerError) Unwrap() error { return ErrNewer }

// IsNewer reports whether err says that data is in a newer format.
func IsNewer(err error) bool { return errors.Is(err, ErrNewer) }

// Check returns a *NewerError if found is newer than reads, else nil.
func Check(file, what string, found, reads uint64) error {
	if found > reads {
		return &NewerError{File: file, What: what, Found: found, Reads: reads}
	}
	return nil
}
