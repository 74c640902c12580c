//go:build !powerloss_nosync

package boltfile

// noSync is bbolt's NoSync for every file this package opens read-write:
// false in every real build. The power-cut suite's control binary is built
// with the powerloss_nosync tag (nosync.go) to prove the suite sees a loss.
const noSync = false

func syncFile(name string) error { return syncPath(name) }

func syncDir(name string) error { return syncPath(name) }
