//go:build !linux

package harness

import "syscall"

// childAttrs: only Linux can tie a child's life to its parent's.
func childAttrs() *syscall.SysProcAttr { return nil }
