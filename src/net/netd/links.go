package main

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// link creates the namespace and the veth joining it to the bridge (the host end isolated, as every
// sandbox's port is: siblings never reach each other at layer 2), the host end up.
func link(r *Request) error {
	bridge, err := netlink.LinkByName(r.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", r.Bridge, err)
	}
	ns, err := createNamedNetns(r.Netns)
	if err != nil {
		return err
	}
	defer ns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: r.Veth, MasterIndex: bridge.Attrs().Index},
		PeerName:      r.Peer,
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", r.Veth, err)
	}
	if err := noAddrGen(r.Veth); err != nil {
		return err
	}
	if err := netlink.LinkSetIsolated(veth, true); err != nil {
		return fmt.Errorf("veth %s isolated: %w", r.Veth, err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return fmt.Errorf("veth %s up: %w", r.Veth, err)
	}
	return nil
}

// configure sets up the inside of the namespace: sysctls, loopback, the tap (gateway address and MAC, the
// guest's permanent neighbour entry), the uplink's address and the default route. Runs in the namespace.
func configure(r *Request) error {
	if err := enterNamedNetns(r.Netns); err != nil {
		return err
	}
	if err := writeSysctls(r.Sysctls); err != nil {
		return err
	}
	if err := linkUp("lo"); err != nil {
		return err
	}
	tap, err := addTap(r.Tap, r.TapMac)
	if err != nil {
		return err
	}
	if err := addAddress(tap, r.TapAddress); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(tap); err != nil {
		return fmt.Errorf("%s up: %w", r.Tap, err)
	}
	guestMac, _ := net.ParseMAC(r.GuestMac)
	neigh := &netlink.Neigh{
		LinkIndex:    tap.Attrs().Index,
		State:        netlink.NUD_PERMANENT,
		IP:           net.ParseIP(r.GuestIP),
		HardwareAddr: guestMac,
	}
	if err := netlink.NeighSet(neigh); err != nil {
		return fmt.Errorf("neighbour %s: %w", r.GuestIP, err)
	}
	return configureUplink(r)
}

func configureUplink(r *Request) error {
	up, err := netlink.LinkByName(r.Uplink)
	if err != nil {
		return fmt.Errorf("%s: %w", r.Uplink, err)
	}
	if err := noAddrGen(r.Uplink); err != nil {
		return err
	}
	if err := addAddress(up, r.UplinkAddress); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(up); err != nil {
		return fmt.Errorf("%s up: %w", r.Uplink, err)
	}
	route := &netlink.Route{LinkIndex: up.Attrs().Index, Gw: net.ParseIP(r.DefaultGateway)}
	if err := netlink.RouteAdd(route); err != nil {
		return fmt.Errorf("default route via %s: %w", r.DefaultGateway, err)
	}
	return nil
}

// addTap creates a persistent tap in the thread's namespace, as `ip tuntap add mode tap` does (no packet
// information header, no owner, no group: netlink's Tuntap would set owner and group root), with the given MAC.
// The launcher attaches QEMU to it later.
func addTap(name, mac string) (netlink.Link, error) {
	if err := persistTap(name); err != nil {
		return nil, fmt.Errorf("tap %s: %w", name, err)
	}
	tap, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("tap %s: %w", name, err)
	}
	if err := noAddrGen(name); err != nil {
		return nil, err
	}
	hw, _ := net.ParseMAC(mac)
	if err := netlink.LinkSetHardwareAddr(tap, hw); err != nil {
		return nil, fmt.Errorf("tap %s address: %w", name, err)
	}
	return tap, nil
}

func persistTap(name string) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	req, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	req.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, req); err != nil {
		return fmt.Errorf("TUNSETIFF: %w", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("TUNSETPERSIST: %w", err)
	}
	return nil
}

func addAddress(l netlink.Link, cidr string) error {
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", cidr, l.Attrs().Name, err)
	}
	return nil
}

func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	return nil
}

// noAddrGen is `ip link set addrgenmode none`: the interface gets no IPv6 link-local address. A host
// without IPv6 has nothing to turn off.
func noAddrGen(ifname string) error {
	err := os.WriteFile("/proc/sys/net/ipv6/conf/"+ifname+"/addr_gen_mode", []byte("1\n"), 0)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s addr_gen_mode: %w", ifname, err)
	}
	return nil
}

// remove deletes the veth (its peer goes with it) and the namespace (the tap and the rules go with it).
// Idempotent: what is already gone is skipped.
func remove(r *Request) error {
	var notFound netlink.LinkNotFoundError
	l, err := netlink.LinkByName(r.Veth)
	if err == nil {
		err = netlink.LinkDel(l)
	}
	if err != nil && !errors.As(err, &notFound) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting %s: %w", r.Veth, err)
	}
	return removeNamedNetns(r.Netns)
}
