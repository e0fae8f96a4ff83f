package main

import (
	"os"
	"syscall"
	"unsafe"
)

// flushNeighbours deletes every neighbour (ARP/NDP) entry of the guest's non-loopback interfaces over
// netlink, as `ip neigh flush` does: the parent's entries (its gateway's MAC, peers) are stale in a child
// whose network was re-plumbed. A guest with no interface but lo does nothing (one readdir).
func flushNeighbours() error {
	entries, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil
	}
	hasNic := false
	for _, e := range entries {
		if e.Name() != "lo" {
			hasNic = true
			break
		}
	}
	if !hasNic {
		return nil
	}
	dump, err := syscall.NetlinkRIB(syscall.RTM_GETNEIGH, syscall.AF_UNSPEC)
	if err != nil {
		return err
	}
	messages, err := syscall.ParseNetlinkMessage(dump)
	if err != nil {
		return err
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return err
	}
	const ndmsgLen = 12 // struct ndmsg: family, pad1, pad2, ifindex, state, flags, type
	seq := uint32(1)
	for _, m := range messages {
		if m.Header.Type != syscall.RTM_NEWNEIGH || len(m.Data) < ndmsgLen {
			continue
		}
		ifindex := *(*int32)(unsafe.Pointer(&m.Data[4]))
		state := *(*uint16)(unsafe.Pointer(&m.Data[8]))
		const nudNoArp, nudPermanent = 0x40, 0x80
		if ifindex == 1 || state&(nudNoArp|nudPermanent) != 0 {
			continue // loopback, or entries the kernel or an admin pinned
		}
		seq++
		// The same ndmsg and attributes (NDA_DST among them) identify the entry to delete.
		msg := make([]byte, syscall.NLMSG_HDRLEN+len(m.Data))
		hdr := (*syscall.NlMsghdr)(unsafe.Pointer(&msg[0]))
		hdr.Len = uint32(len(msg))
		hdr.Type = syscall.RTM_DELNEIGH
		hdr.Flags = syscall.NLM_F_REQUEST
		hdr.Seq = seq
		copy(msg[syscall.NLMSG_HDRLEN:], m.Data)
		_ = syscall.Sendto(fd, msg, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK})
	}
	return nil
}
