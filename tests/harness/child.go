package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/internal/shutdown"
)

// killWait bounds the wait for a process to disappear after SIGKILL; only a
// process stuck in the kernel (D state) takes longer.
const killWait = 10 * time.Second

// child is one run of an external program. Its stdout and stderr go straight
// to a log file (the kernel writes them, so output survives a SIGKILL).
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
}

// startChild appends marker to logPath and then starts path with args,
// writing the child's output after it.
func startChild(path string, args, env []string, dir, logPath, marker string) (*child, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log file %s: %w", logPath, err)
	}
	// The child holds its own descriptor; ours is only needed until Start.
	defer logFile.Close()
	if marker != "" {
		if _, err := logFile.WriteString(marker + "\n"); err != nil {
			return nil, fmt.Errorf("write start marker to %s: %w", logPath, err)
		}
	}
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = childAttrs()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // the exit status is read from cmd.ProcessState
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) running() bool { return !shutdown.Closed(c.done) }

// wait reports whether the process exited within timeout.
func (c *child) wait(timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-c.done:
		return true
	case <-timer.C:
		return false
	}
}

// exitCode is the process's exit status, or -1 if a signal ended it.
// Valid only after done is closed.
func (c *child) exitCode() int { return c.cmd.ProcessState.ExitCode() }

// kill sends SIGKILL and waits for the process to be reaped.
func (c *child) kill() error {
	if !c.running() {
		return nil
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("SIGKILL pid %d: %w", c.pid(), err)
	}
	if !c.wait(killWait) {
		return fmt.Errorf("pid %d still running %s after SIGKILL", c.pid(), killWait)
	}
	return nil
}

// stop sends SIGTERM and waits up to timeout; a process still running then
// is SIGKILLed and stop returns an error saying so.
func (c *child) stop(timeout time.Duration) error {
	if !c.running() {
		return nil
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("SIGTERM pid %d: %w", c.pid(), err)
	}
	if c.wait(timeout) {
		return nil
	}
	if err := c.kill(); err != nil {
		return err
	}
	return fmt.Errorf("pid %d ignored SIGTERM for %s and was SIGKILLed", c.pid(), timeout)
}

// logFrom returns the file at path from offset from on: the current run's
// part of a log that several runs append to ("" if it is unreadable).
func logFrom(path string, from int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < from {
		return ""
	}
	return string(b[from:])
}

// tail returns the last n lines of the file at path ("" if it is unreadable).
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if n > 0 && len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
