package main

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"syscall"

	"forkd/src/agent/guest/protocol"
)

// Stats reports memory from /proc/meminfo and the usage of the filesystem args.Path is on (E2B's metrics).
func (a *Agent) Stats(c *Call, args *protocol.StatsArgs, body []byte) (*protocol.StatsResult, []byte, error) {
	path := "/"
	if args.Path != nil {
		path = *args.Path
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(path, &fs); err != nil {
		return nil, nil, fsError(err, "stats", path)
	}
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, nil, fsError(unwrapPath(err), "stats", "/proc/meminfo")
	}
	mem := parseMeminfo(meminfo)
	block := uint64(fs.Bsize)
	return &protocol.StatsResult{
		MemTotalBytes:     int64(mem["MemTotal"]),
		MemAvailableBytes: int64(mem["MemAvailable"]),
		MemCacheBytes:     int64(mem["Cached"] + mem["Buffers"]),
		DiskTotalBytes:    int64(fs.Blocks * block),
		DiskUsedBytes:     int64((fs.Blocks - fs.Bfree) * block),
	}, nil, nil
}

// parseMeminfo reads the "Name:   N kB" lines of /proc/meminfo, in bytes.
func parseMeminfo(text []byte) map[string]uint64 {
	out := make(map[string]uint64, 64)
	scanner := bufio.NewScanner(bytes.NewReader(text))
	for scanner.Scan() {
		fields := bytes.Fields(scanner.Bytes())
		if len(fields) < 2 || !bytes.HasSuffix(fields[0], []byte(":")) {
			continue
		}
		value, err := strconv.ParseUint(string(fields[1]), 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 2 && string(fields[2]) == "kB" {
			value *= 1024
		}
		out[string(bytes.TrimSuffix(fields[0], []byte(":")))] = value
	}
	return out
}
