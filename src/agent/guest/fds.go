package main

import (
	"os"
	"strconv"
	"syscall"
)

// markInheritedCloseOnExec: descriptors inherited from whoever started the agent (anything above stdio)
// would otherwise be inherited by every process it spawns. Go opens its own with O_CLOEXEC.
func markInheritedCloseOnExec() []int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var marked []int
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
		if errno != 0 || flags&syscall.FD_CLOEXEC != 0 {
			continue // closed meanwhile (the readdir handle), or already set
		}
		if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_SETFD, flags|syscall.FD_CLOEXEC); errno == 0 {
			marked = append(marked, fd)
		}
	}
	return marked
}
