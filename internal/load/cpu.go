package load

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// cpuSample is the CPU time (user + system) the client and, when its pid
// is known, the server have used so far. On a machine shared with other
// work, CPU time per call is a steadier measure than calls per second:
// a neighbour's burst slows both processes' clocks but not the work each
// call costs.
type cpuSample struct {
	client, server time.Duration
	serverOK       bool
}

// sampleCPU reads the client's own CPU time and the server's (pid > 0).
func sampleCPU(pid int) cpuSample {
	s := cpuSample{client: ProcessCPU()}
	if pid > 0 {
		if d, err := procCPU(pid); err == nil {
			s.server, s.serverOK = d, true
		}
	}
	return s
}

// userHZ is the unit of /proc/<pid>/stat's times: USER_HZ, 100 on every
// Linux architecture Go supports.
const userHZ = 100

// procCPU reads utime + stime of every thread of process pid (fields 14
// and 15 of /proc/<pid>/stat, which count exited threads too).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("server cpu: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing one.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("server cpu: /proc/%d/stat: no command field", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 { // state is field 3: utime and stime are the 12th and 13th after ')'
		return 0, fmt.Errorf("server cpu: /proc/%d/stat: %d fields", pid, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("server cpu: /proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
