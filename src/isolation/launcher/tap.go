package main

import (
	"fmt"
	"syscall"
	"unsafe"
)

// From <linux/if_tun.h>.
const (
	tunSetIff  = 0x400454ca
	iffTap     = 0x0002
	iffNoPi    = 0x1000
	iffVnetHdr = 0x4000
)

// struct ifreq as TUNSETIFF and SIOC[GS]IFFLAGS use it: the name, then a short, padded to 40 bytes.
type ifreq struct {
	name  [16]byte
	flags uint16
	_     [22]byte
}

func ioctl(fd int, request uintptr, req *ifreq) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), request, uintptr(unsafe.Pointer(req))); errno != 0 {
		return errno
	}
	return nil
}

// openTap attaches to the tap device p.TapName in the current network namespace (creating a non-persistent
// one if it does not exist, which then vanishes with the program) and leaves it open at fd p.TapFd without
// close-on-exec, for QEMU's `-netdev tap,fd=N`. With TapVnetHdr (IFF_VNET_HDR) the guest's NIC can use
// checksum and segmentation offloads; QEMU saves whether it had them, so a restored child must match its
// parent.
func openTap(p *Plan) error {
	// The tun driver binds the device to the network namespace of the task that opens /dev/net/tun.
	fd, err := syscall.Open("/dev/net/tun", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var req ifreq
	copy(req.name[:], p.TapName)
	req.flags = iffTap | iffNoPi
	if p.TapVnetHdr {
		req.flags |= iffVnetHdr
	}
	if err := ioctl(fd, tunSetIff, &req); err != nil {
		syscall.Close(fd)
		return fmt.Errorf("TUNSETIFF %s: %w", p.TapName, err)
	}
	if fd == p.TapFd {
		_, err = fcntl(fd, syscall.F_SETFD, 0)
		return err
	}
	// dup3 without O_CLOEXEC: the copy at TapFd is inherited by the program, the original is not. Whatever was
	// inherited at TapFd (not a --keep-fd: validated) is replaced.
	if err := syscall.Dup3(fd, p.TapFd, 0); err != nil {
		syscall.Close(fd)
		return fmt.Errorf("dup3 to fd %d: %w", p.TapFd, err)
	}
	return syscall.Close(fd)
}

func fcntl(fd int, cmd int, arg int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), uintptr(arg))
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}
