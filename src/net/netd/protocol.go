package main

import (
	"fmt"
	"net"
	"regexp"
	"strings"
)

// The operations, as src/net/netd-client.ts names them (a test there checks both lists agree).
const (
	opLink      = "link"
	opConfigure = "configure"
	opRules     = "rules"
	opRemove    = "remove"
)

// Request is one line of the daemon's stdin stream: an id it chose, an operation and that operation's fields.
// Every field is validated before anything is changed on the host.
type Request struct {
	ID int64  `json:"id"`
	Op string `json:"op"`
	// The named network namespace (/run/netns/<Netns>) every operation is about.
	Netns string `json:"netns"`
	// link, remove: the veth's host end. link: its peer's name inside the namespace and the bridge it joins.
	Veth   string `json:"veth,omitempty"`
	Peer   string `json:"peer,omitempty"`
	Bridge string `json:"bridge,omitempty"`
	// configure: the tap (its MAC and the gateway address with prefix), the guest's fixed neighbour entry, the
	// uplink's address with prefix and the default route's gateway.
	Tap            string `json:"tap,omitempty"`
	TapMac         string `json:"tapMac,omitempty"`
	TapAddress     string `json:"tapAddress,omitempty"`
	GuestIP        string `json:"guestIp,omitempty"`
	GuestMac       string `json:"guestMac,omitempty"`
	Uplink         string `json:"uplink,omitempty"`
	UplinkAddress  string `json:"uplinkAddress,omitempty"`
	DefaultGateway string `json:"defaultGateway,omitempty"`
	// configure, rules: net.* sysctls written inside the namespace first.
	Sysctls [][2]string `json:"sysctls,omitempty"`
	// rules: an nft script applied inside the namespace as one transaction (nft -f -).
	Script string `json:"script,omitempty"`
}

// Response is one line of stdout: the request's id and either ok or the error that stopped it.
type Response struct {
	ID    int64  `json:"id"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

var (
	netnsName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	ifName    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)
	sysctlKey = regexp.MustCompile(`^net(\.[a-z0-9_]+)+$`)
	sysctlVal = regexp.MustCompile(`^[0-9]{1,10}$`)
)

func (r *Request) validate() error {
	if !netnsName.MatchString(r.Netns) {
		return fmt.Errorf("bad namespace name %q", r.Netns)
	}
	switch r.Op {
	case opLink:
		return allIfNames(r.Veth, r.Peer, r.Bridge)
	case opRemove:
		return allIfNames(r.Veth)
	case opConfigure:
		if err := allIfNames(r.Tap, r.Uplink); err != nil {
			return err
		}
		if err := allMacs(r.TapMac, r.GuestMac); err != nil {
			return err
		}
		if err := allCidrs(r.TapAddress, r.UplinkAddress); err != nil {
			return err
		}
		if err := allIPv4(r.GuestIP, r.DefaultGateway); err != nil {
			return err
		}
		return validSysctls(r.Sysctls)
	case opRules:
		if strings.TrimSpace(r.Script) == "" {
			return fmt.Errorf("empty nft script")
		}
		return validSysctls(r.Sysctls)
	}
	return fmt.Errorf("unknown operation %q", r.Op)
}

func allIfNames(names ...string) error {
	for _, n := range names {
		if !ifName.MatchString(n) {
			return fmt.Errorf("bad interface name %q", n)
		}
	}
	return nil
}

func allMacs(macs ...string) error {
	for _, m := range macs {
		if hw, err := net.ParseMAC(m); err != nil || len(hw) != 6 {
			return fmt.Errorf("bad MAC address %q", m)
		}
	}
	return nil
}

func allCidrs(cidrs ...string) error {
	for _, c := range cidrs {
		if ip, _, err := net.ParseCIDR(c); err != nil || ip.To4() == nil {
			return fmt.Errorf("bad IPv4 address/prefix %q", c)
		}
	}
	return nil
}

func allIPv4(ips ...string) error {
	for _, s := range ips {
		if ip := net.ParseIP(s); ip == nil || ip.To4() == nil {
			return fmt.Errorf("bad IPv4 address %q", s)
		}
	}
	return nil
}

func validSysctls(sysctls [][2]string) error {
	for _, s := range sysctls {
		if !sysctlKey.MatchString(s[0]) || !sysctlVal.MatchString(s[1]) {
			return fmt.Errorf("bad sysctl %q=%q", s[0], s[1])
		}
	}
	return nil
}
