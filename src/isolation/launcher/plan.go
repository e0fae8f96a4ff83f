package main

// The launcher's declared command line. Every flag is validated before any step runs, so a bad argument
// never leaves the process half-way through its steps (inside a namespace, with a tap open).

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Plan is what one launch does, in the order the steps run (see steps.go).
type Plan struct {
	// NetnsPath joins the named network namespace at this path (/run/netns/<name>).
	NetnsPath string
	// NewNetns gives the program a fresh, empty network namespace of its own (it dies with the program).
	NewNetns bool
	// Sysctls are written inside the (joined or new) network namespace: only net.* keys.
	Sysctls []Sysctl
	// Tap attaches to (or creates) the tap device TapName in the namespace and leaves it open at TapFd.
	TapName string
	TapFd   int
	// TapVnetHdr opens the tap with IFF_VNET_HDR (virtio-net offloads).
	TapVnetHdr bool
	// KeepFds are the inherited fds (besides 0-2) the program gets; every other inherited fd is closed at exec.
	KeepFds []int
	// Program and Args are exec'd last; Program is an absolute path or a name looked up in PATH.
	Program string
	Args    []string
}

type Sysctl struct{ Key, Value string }

const usage = `usage: forkd-launcher [--netns /run/netns/NAME | --new-netns] [--sysctl net.KEY=N ...]
                      [--tap NAME --tap-fd N [--tap-vnet-hdr]] [--keep-fd N ...] -- PROGRAM [ARG ...]`

var (
	netnsPathPattern = regexp.MustCompile(`^/run/netns/[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	// Linux interface names: at most IFNAMSIZ-1 = 15 bytes; we allow a conservative character set.
	ifnamePattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,14}$`)
	sysctlKey       = regexp.MustCompile(`^net\.(ipv4|ipv6|core|netfilter)\.[A-Za-z0-9_.-]{1,100}$`)
	sysctlValue     = regexp.MustCompile(`^[0-9]{1,10}$`)
	programName     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`)
	errUsage        = errors.New(usage)
	minTapFd, maxFd = 3, 1023
)

// ParsePlan reads the launcher's own flags up to "--"; everything after it is the program and its arguments.
func ParsePlan(argv []string) (*Plan, error) {
	plan := &Plan{TapFd: -1}
	i := 0
	value := func(flag string) (string, error) {
		if i+1 >= len(argv) {
			return "", fmt.Errorf("%s needs a value\n%s", flag, usage)
		}
		i++
		return argv[i], nil
	}
	for ; i < len(argv); i++ {
		arg := argv[i]
		if arg == "--" {
			i++
			break
		}
		var err error
		var v string
		switch arg {
		case "--netns":
			if v, err = value(arg); err == nil {
				if !netnsPathPattern.MatchString(v) || strings.Contains(v, "/../") {
					return nil, fmt.Errorf("--netns %q: must be /run/netns/<name>", v)
				}
				plan.NetnsPath = v
			}
		case "--new-netns":
			plan.NewNetns = true
		case "--sysctl":
			if v, err = value(arg); err == nil {
				key, val, ok := strings.Cut(v, "=")
				if !ok || !sysctlKey.MatchString(key) || strings.Contains(key, "..") || !sysctlValue.MatchString(val) {
					return nil, fmt.Errorf("--sysctl %q: must be net.<ipv4|ipv6|core|netfilter>.<key>=<integer>", v)
				}
				plan.Sysctls = append(plan.Sysctls, Sysctl{key, val})
			}
		case "--tap":
			if v, err = value(arg); err == nil {
				if !ifnamePattern.MatchString(v) {
					return nil, fmt.Errorf("--tap %q: must be an interface name of at most 15 characters [A-Za-z0-9_-]", v)
				}
				plan.TapName = v
			}
		case "--keep-fd":
			if v, err = value(arg); err == nil {
				n, convErr := strconv.Atoi(v)
				if convErr != nil || n < minTapFd || n > maxFd {
					return nil, fmt.Errorf("--keep-fd %q: must be an integer in %d..%d", v, minTapFd, maxFd)
				}
				plan.KeepFds = append(plan.KeepFds, n)
			}
		case "--tap-vnet-hdr":
			plan.TapVnetHdr = true
		case "--tap-fd":
			if v, err = value(arg); err == nil {
				n, convErr := strconv.Atoi(v)
				if convErr != nil || n < minTapFd || n > maxFd {
					return nil, fmt.Errorf("--tap-fd %q: must be an integer in %d..%d", v, minTapFd, maxFd)
				}
				plan.TapFd = n
			}
		default:
			return nil, fmt.Errorf("unknown argument %q (the program goes after --)\n%s", arg, usage)
		}
		if err != nil {
			return nil, err
		}
	}
	if i >= len(argv) {
		return nil, fmt.Errorf("no program given after --\n%s", usage)
	}
	plan.Program, plan.Args = argv[i], argv[i+1:]
	return plan, plan.validate()
}

func (p *Plan) validate() error {
	if p.NetnsPath != "" && p.NewNetns {
		return errors.New("--netns and --new-netns exclude each other")
	}
	if (p.TapName == "") != (p.TapFd < 0) {
		return errors.New("--tap and --tap-fd go together")
	}
	for _, fd := range p.KeepFds {
		if fd == p.TapFd {
			return fmt.Errorf("--tap-fd %d is also a --keep-fd", fd)
		}
	}
	if p.TapVnetHdr && p.TapName == "" {
		return errors.New("--tap-vnet-hdr needs --tap")
	}
	if p.TapName != "" && p.NetnsPath == "" && !p.NewNetns {
		return errors.New("--tap needs --netns or --new-netns: a tap is only opened inside a sandbox's namespace")
	}
	if len(p.Sysctls) > 0 && p.NetnsPath == "" && !p.NewNetns {
		return errors.New("--sysctl needs --netns or --new-netns: the launcher never changes the host's settings")
	}
	if !strings.HasPrefix(p.Program, "/") && !programName.MatchString(p.Program) {
		return fmt.Errorf("program %q: must be an absolute path or a plain command name", p.Program)
	}
	if strings.ContainsRune(p.Program, 0) {
		return errors.New("program contains a NUL byte")
	}
	return nil
}
