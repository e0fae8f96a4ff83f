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
	defer syscall.Close(fd)
	old := syscall.Umask(0o177)
	err = syscall.Bind(fd, &syscall.SockaddrUnix{Name: p.ListenPath})
	syscall.Umask(old)
	if err != nil {
		return fmt.Errorf("bind %s: %w", p.ListenPath, err)
	}
	if err := syscall.Listen(fd, 8); err != nil {
		return fmt.Errorf("listen %s: %w", p.ListenPath, err)
	}
	if err := syscall.Dup3(fd, p.ListenFd, 0); err != nil {
		return fmt.Errorf("dup3 to fd %d: %w", p.ListenFd, err)
	}
	return nil
}
