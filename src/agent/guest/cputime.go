package main

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// userHz is the unit of /proc/<pid>/stat's utime and stime: USER_HZ, 100 on every Linux architecture the
// guest runs on (the kernel's ABI, independent of its CONFIG_HZ).
const userHz = 100

// processCPUTime is the CPU time (user + system) process pid has used, or false when it cannot be read (the
// process is gone).
func processCPUTime(pid int) (time.Duration, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	return parseStatCPUTime(string(raw))
}

// parseStatCPUTime reads utime and stime (fields 14 and 15) of a /proc/<pid>/stat line. The command name
// (field 2, in parentheses) may hold spaces and parentheses itself: the fields are counted after its last ')'.
func parseStatCPUTime(stat string) (time.Duration, bool) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, false
	}
	fields := strings.Fields(stat[end+1:])
	// fields[0] is field 3 (state): utime is field 14, stime field 15.
	if len(fields) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / userHz, true
}
