package main

import (
	"fmt"
	"os"
	"syscall"
)

// listenUnix binds a unix socket at p.ListenPath (replacing a stale socket there, nothing else), listens, and
// leaves it at fd p.ListenFd without close-on-exec. The socket file is root's, mode 0600: only the daemon
// connects to it; the program accepts on the fd it inherits.
func listenUnix(p *Plan) error {
	if info, err := os.Lstat(p.ListenPath); err == nil {
		if info.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("%s exists and is not a socket", p.ListenPath)
		}
		if err := os.Remove(p.ListenPath); err != nil {
			return err
		}
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	old := syscall.Umask(0o177)
	err = syscall.Bind(fd, &syscall.SockaddrUnix{Name: p.ListenPath})
	syscall.Umask(old)
	if err != nil {
		return fmt.Errorf("bind %s: %w", p.ListenPath, err)
	}
	if err := syscall.Listen(fd, 8); err != nil {
		syscall.Close(fd)
		return fmt.Errorf("listen %s: %w", p.ListenPath, err)
	}
	return placeFd(fd, p.ListenFd)
}

// placeFd leaves the open fd at number `at` without close-on-exec (the program inherits it) and closes the
// original. Whatever was inherited at `at` is replaced.
func placeFd(fd, at int) error {
	if fd == at {
		_, err := fcntl(fd, syscall.F_SETFD, 0)
		return err
	}
	if err := syscall.Dup3(fd, at, 0); err != nil {
		syscall.Close(fd)
		return fmt.Errorf("dup3 to fd %d: %w", at, err)
	}
	return syscall.Close(fd)
}
