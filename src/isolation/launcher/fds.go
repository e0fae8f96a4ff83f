package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// close_range(2) on x86-64 and its flag that marks the fds close-on-exec instead of closing them.
const (
	sysCloseRange     = 436
	closeRangeCloexec = 1 << 2
)

// closeInheritedFds makes every inherited fd above 2 close-on-exec except the --keep-fd ones, so the program
// gets only what it was meant to (a daemon started with stray fds must not hand them to QEMU). Marking rather
// than closing leaves the Go runtime's own fds usable until exec.
func closeInheritedFds(p *Plan) error {
	if _, _, errno := syscall.Syscall(sysCloseRange, 3, ^uintptr(0), closeRangeCloexec); errno != 0 {
		if errno != syscall.ENOSYS && errno != syscall.EINVAL {
			return fmt.Errorf("close_range: %w", errno)
		}
		if err := markCloexecByProc(); err != nil {
			return err
		}
	}
	for _, fd := range p.KeepFds {
		if _, err := fcntl(fd, syscall.F_SETFD, 0); err != nil {
			return fmt.Errorf("--keep-fd %d: %w", fd, err)
		}
	}
	return nil
}

// markCloexecByProc is the same for kernels before 5.11 (no CLOSE_RANGE_CLOEXEC).
func markCloexecByProc() error {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		_, _ = fcntl(fd, syscall.F_SETFD, syscall.FD_CLOEXEC)
	}
	return nil
}
