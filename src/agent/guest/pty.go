package main

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// openPty opens a new pseudo-terminal pair through /dev/ptmx (unlock, then the slave's number).
func openPty() (master *os.File, slave *os.File, err error) {
	fd, err := syscall.Open("/dev/ptmx", syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var unlock int32
	if e := ioctl(uintptr(fd), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		syscall.Close(fd)
		return nil, nil, fmt.Errorf("TIOCSPTLCK: %w", e)
	}
	var n uint32
	if e := ioctl(uintptr(fd), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		syscall.Close(fd)
		return nil, nil, fmt.Errorf("TIOCGPTN: %w", e)
	}
	name := fmt.Sprintf("/dev/pts/%d", n)
	sfd, err := syscall.Open(name, syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		syscall.Close(fd)
		return nil, nil, err
	}
	// The master is read and written through Go's poller (nonblocking), so a write can be abandoned.
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		syscall.Close(sfd)
		return nil, nil, err
	}
	return os.NewFile(uintptr(fd), "ptmx"), os.NewFile(uintptr(sfd), name), nil
}

type winsize struct {
	Rows, Cols, X, Y uint16
}

func setWinsize(f *os.File, cols, rows int64) error {
	ws := winsize{Rows: uint16(rows), Cols: uint16(cols)}
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var e syscall.Errno
	if cerr := raw.Control(func(fd uintptr) { e = ioctl(fd, syscall.TIOCSWINSZ, uintptr(unsafe.Pointer(&ws))) }); cerr != nil {
		return cerr
	}
	if e != 0 {
		return e
	}
	return nil
}
