package harness

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// RemotePorts returns the remote ports of the established TCP connections
// that process pid holds open, read from /proc (Linux only). A test uses
// it to learn which broker node a client is connected to right now.
func RemotePorts(pid int) ([]int, error) {
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(fd)
		if err == nil && strings.HasPrefix(target, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			return nil, fmt.Errorf("read the TCP table of pid %d: %w", pid, err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "01" || !inodes[fields[9]] { // 01: ESTABLISHED
				continue
			}
			_, hexPort, ok := strings.Cut(fields[2], ":")
			if !ok {
				continue
			}
			if port, err := strconv.ParseUint(hexPort, 16, 16); err == nil {
				ports = append(ports, int(port))
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return ports, nil
}
