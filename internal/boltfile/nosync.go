//go:build powerloss_nosync

package boltfile

// A build for tests/powerloss's control run only: no fsync at all, so a
// power cut must lose acknowledged records. Never a user option: the tag
// exists only in that suite's build command.
const noSync = true

func syncFile(string) error { return nil }

func syncDir(string) error { return nil }
