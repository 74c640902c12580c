package harness

import "syscall"

// childAttrs makes the kernel SIGKILL a child when the test binary dies, so
// an interrupted `go test` leaves no broker or pipeline running. (Linux ties
// this to the thread that started the child; Go keeps its threads alive
// unless a goroutine exits while locked to one, which tests do not do.)
func childAttrs() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
