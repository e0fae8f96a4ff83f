package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// setns(2) on x86-64; Go 1.19's syscall package has no constant for it.
const sysSetns = 308

func enterNetns(p *Plan) error {
	if p.NewNetns {
		if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
		}
		return bringLoopbackUp()
	}
	fd, err := syscall.Open(p.NetnsPath, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", p.NetnsPath, err)
	}
	defer syscall.Close(fd)
	if _, _, errno := syscall.RawSyscall(sysSetns, uintptr(fd), syscall.CLONE_NEWNET, 0); errno != 0 {
		return fmt.Errorf("setns(%s): %w", p.NetnsPath, errno)
	}
	return nil
}

// A fresh namespace's loopback is down; QEMU itself never needs it, but anything it runs might.
func bringLoopbackUp() error {
	sock, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer syscall.Close(sock)
	var req ifreq
	copy(req.name[:], "lo")
	if err := ioctl(sock, syscall.SIOCGIFFLAGS, &req); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	req.flags |= syscall.IFF_UP
	if err := ioctl(sock, syscall.SIOCSIFFLAGS, &req); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return nil
}

// writeSysctls writes net.* settings of the namespace the thread is in: the kernel resolves /proc/sys/net for
// the network namespace of the task that opens the file, which is this (locked) thread.
func writeSysctls(p *Plan) error {
	for _, s := range p.Sysctls {
		file := filepath.Join("/proc/sys", strings.ReplaceAll(s.Key, ".", "/"))
		if err := os.WriteFile(file, []byte(s.Value+"\n"), 0); err != nil {
			return fmt.Errorf("%s=%s: %w", s.Key, s.Value, err)
		}
	}
	return nil
}
