package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
)

// joinCgroups moves the launcher (and so the program it becomes) into each cgroup before anything runs in
// it: the limits hold from the program's first instruction, with no window in which it runs unlimited.
// Writing to cgroup.procs moves every thread of the process (the Go runtime's too).
func joinCgroups(p *Plan) error {
	pid := strconv.Itoa(os.Getpid())
	for _, dir := range p.Cgroups {
		info, err := os.Lstat(dir)
		if err != nil {
			return err
		}
		if !info.IsDir() {
			return fmt.Errorf("%s is not a cgroup directory", dir)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(pid), 0); err != nil {
			return fmt.Errorf("join %s: %w", dir, err)
		}
	}
	return nil
}

// setFileSizeLimit caps every file the program writes at p.FsizeLimit bytes. SIGXFSZ is ignored (an ignored
// disposition survives execve), so a write past the limit fails with EFBIG and the program carries on.
func setFileSizeLimit(p *Plan) error {
	limit := uint64(p.FsizeLimit)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: limit, Max: limit}); err != nil {
		return fmt.Errorf("setrlimit(RLIMIT_FSIZE, %d): %w", limit, err)
	}
	signal.Ignore(syscall.SIGXFSZ)
	return nil
}

// disableCoreDumps: a crashing VM must not write its guest's RAM into a core file (or a core handler's store).
func disableCoreDumps(*Plan) error {
	if err := syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{}); err != nil {
		return fmt.Errorf("setrlimit(RLIMIT_CORE, 0): %w", err)
	}
	return nil
}
