package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// which Linux fixes at 100 for user space on every architecture.
const clockTick = 10 * time.Millisecond

// procStat returns the parent pid and the CPU time (user + system) of pid.
func procStat(pid int) (ppid int, cpu time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start with field 3, the state.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	ppid, _ = strconv.Atoi(f[1])    // field 4
	utime, _ := strconv.Atoi(f[11]) // field 14
	stime, _ := strconv.Atoi(f[12]) // field 15
	return ppid, time.Duration(utime+stime) * clockTick, nil
}

// TreeCPU returns the CPU time used so far by pid and every live
// descendant of it (Linux only). Children that already exited are not
// counted; sample while the processes of interest are running.
func TreeCPU(pid int) (time.Duration, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, err
	}
	children := map[int][]int{}
	own := map[int]time.Duration{}
	for _, d := range dirs {
		p, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		ppid, cpu, err := procStat(p)
		if err != nil {
			continue // exited meanwhile
		}
		children[ppid] = append(children[ppid], p)
		own[p] = cpu
	}
	if _, ok := own[pid]; !ok {
		return 0, fmt.Errorf("process %d is not running", pid)
	}
	var total time.Duration
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		total += own[p]
		queue = append(queue, children[p]...)
	}
	return total, nil
}
