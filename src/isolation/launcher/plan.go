package main

// The launcher's declared command line. Every flag is validated before any step runs, so a bad argument
// never leaves the process half-way through its steps (inside a namespace, with a tap open).

import (
	"errors"
	"fmt"
	"path/filepath"
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
	// ListenPath: a unix socket the launcher binds and listens on (as root, before handing anything over),
	// left open at ListenFd: QEMU's monitor takes it as `-chardev socket,fd=N,server=on`, so QEMU itself never
	// needs to create a file.
	ListenPath string
	ListenFd   int
	// Cgroups are cgroup directories (one per v1 hierarchy, or one v2 cgroup) the launcher joins before exec,
	// so the program is limited from its first instruction.
	Cgroups []string
	// FsizeLimit (bytes, > 0) caps the size of every file the program writes (RLIMIT_FSIZE, with SIGXFSZ
	// ignored: a write past it fails with EFBIG instead of killing the program).
	FsizeLimit int64
	// Confine, when set, runs the program unprivileged in a mount namespace of its own (confine.go, mounts.go).
	Confine *Confinement
	// ParentPid > 0: the program gets SIGKILL when its parent (this pid, the launcher's parent) exits.
	ParentPid int
	// Program and Args are exec'd last; Program is an absolute path or a name looked up in PATH.
	Program string
	Args    []string
}

// Confinement: the program runs as uid = gid = UidBase + its own pid (unique among live processes, so no two
// confined programs ever share an identity), with no capabilities and no_new_privs, in a mount namespace that
// shows only RunDir (which stays root's, mode 0710 with the program's gid: it can reach what is in it but
// create nothing), the Own files (handed over to it, read-write), the ReadOnly paths, the system's /usr and
// loader files, a few /dev nodes and a /proc that lists only its own processes.
type Confinement struct {
	UidBase  int
	RunDir   string
	Own      []string
	ReadOnly []string
	// Libraries are read-only too, but mapped executable (a library the program preloads).
	Libraries []string
	// Devices are extra /dev nodes by name (e.g. "kvm"); the program gets each one's group as a supplementary
	// group, so it can open the node and nothing else that group owns.
	Devices []string
}

type Sysctl struct{ Key, Value string }

const usage = `usage: forkd-launcher [--netns /run/netns/NAME | --new-netns] [--sysctl net.KEY=N ...]
                      [--tap NAME --tap-fd N [--tap-vnet-hdr]] [--keep-fd N ...]
                      [--listen-socket PATH --listen-fd N]
                      [--cgroup /sys/fs/cgroup/... ...] [--fsize-limit BYTES] [--die-with-parent PID]
                      [--uid-base N --run-dir DIR [--own FILE ...] [--ro PATH ...] [--ro-exec FILE ...]
                      [--dev NAME ...]]
                      -- PROGRAM [ARG ...]`

var (
	netnsPathPattern = regexp.MustCompile(`^/run/netns/[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	// Linux interface names: at most IFNAMSIZ-1 = 15 bytes; we allow a conservative character set.
	ifnamePattern   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,14}$`)
	sysctlKey       = regexp.MustCompile(`^net\.(ipv4|ipv6|core|netfilter)\.[A-Za-z0-9_.-]{1,100}$`)
	sysctlValue     = regexp.MustCompile(`^[0-9]{1,10}$`)
	programName     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`)
	cgroupPattern   = regexp.MustCompile(`^/sys/fs/cgroup/[A-Za-z0-9._/:-]+$`)
	errUsage        = errors.New(usage)
	minTapFd, maxFd = 3, 1023
)

// Bounds of a confined identity: above every regular and system id (and the 16-bit legacy range), and
// UidBase + pid must stay below 2^31-1, which some tools treat as signed.
const (
	minUidBase = 65536
	maxUid     = 1<<31 - 2
	maxPath    = 4000
	// sizeof(sockaddr_un.sun_path) minus the terminating NUL.
	maxUnixPath = 107
)

// Extra /dev nodes a confined program may be given (besides null, zero, full, random, urandom).
var allowedDevices = map[string]bool{"kvm": true}

// ParsePlan reads the launcher's own flags up to "--"; everything after it is the program and its arguments.
func ParsePlan(argv []string) (*Plan, error) {
	plan := &Plan{TapFd: -1, ListenFd: -1}
	var confine Confinement
	uidBaseSet := false
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
		case "--listen-socket":
			if v, err = value(arg); err == nil {
				if err = checkPath(arg, v); err == nil {
					plan.ListenPath = v
				}
			}
		case "--listen-fd":
			if v, err = value(arg); err == nil {
				n, convErr := strconv.Atoi(v)
				if convErr != nil || n < minTapFd || n > maxFd {
					return nil, fmt.Errorf("--listen-fd %q: must be an integer in %d..%d", v, minTapFd, maxFd)
				}
				plan.ListenFd = n
			}
		case "--cgroup":
			if v, err = value(arg); err == nil {
				if !cgroupPattern.MatchString(v) || len(v) > maxPath || filepath.Clean(v) != v || hasDotSegment(v) {
					return nil, fmt.Errorf("--cgroup %q: must be a clean path under /sys/fs/cgroup/", v)
				}
				plan.Cgroups = append(plan.Cgroups, v)
			}
		case "--fsize-limit":
			if v, err = value(arg); err == nil {
				n, convErr := strconv.ParseInt(v, 10, 64)
				if convErr != nil || n < 1<<20 || n > 1<<50 {
					return nil, fmt.Errorf("--fsize-limit %q: must be a byte count in 1 MiB..1 PiB", v)
				}
				plan.FsizeLimit = n
			}
		case "--die-with-parent":
			if v, err = value(arg); err == nil {
				n, convErr := strconv.Atoi(v)
				if convErr != nil || n < 2 {
					return nil, fmt.Errorf("--die-with-parent %q: must be the parent's pid", v)
				}
				plan.ParentPid = n
			}
		case "--uid-base":
			if v, err = value(arg); err == nil {
				n, convErr := strconv.Atoi(v)
				if convErr != nil || n < minUidBase || n > maxUid {
					return nil, fmt.Errorf("--uid-base %q: must be an integer in %d..%d", v, minUidBase, maxUid)
				}
				confine.UidBase = n
				uidBaseSet = true
			}
		case "--run-dir":
			if v, err = value(arg); err == nil {
				if err = checkPath(arg, v); err == nil {
					confine.RunDir = v
				}
			}
		case "--own":
			if v, err = value(arg); err == nil {
				if err = checkPath(arg, v); err == nil {
					confine.Own = append(confine.Own, v)
				}
			}
		case "--ro":
			if v, err = value(arg); err == nil {
				if err = checkPath(arg, v); err == nil {
					confine.ReadOnly = append(confine.ReadOnly, v)
				}
			}
		case "--ro-exec":
			if v, err = value(arg); err == nil {
				if err = checkPath(arg, v); err == nil {
					confine.Libraries = append(confine.Libraries, v)
				}
			}
		case "--dev":
			if v, err = value(arg); err == nil {
				if !allowedDevices[v] {
					return nil, fmt.Errorf("--dev %q: not a device a confined program may have (kvm)", v)
				}
				confine.Devices = append(confine.Devices, v)
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
	confining := uidBaseSet || confine.RunDir != "" || len(confine.Own) > 0 || len(confine.ReadOnly) > 0 ||
		len(confine.Libraries) > 0 || len(confine.Devices) > 0
	if confining {
		if !uidBaseSet || confine.RunDir == "" {
			return nil, errors.New("--uid-base and --run-dir go together (and --own, --ro, --ro-exec, --dev need both)")
		}
		plan.Confine = &confine
	}
	return plan, plan.validate()
}

// checkPath: an absolute, clean path without "." or ".." segments (what it names is checked when it is used).
func checkPath(flag, v string) error {
	if !strings.HasPrefix(v, "/") || v == "/" || filepath.Clean(v) != v || hasDotSegment(v) ||
		len(v) > maxPath || strings.ContainsRune(v, 0) {
		return fmt.Errorf("%s %q: must be a clean absolute path other than /", flag, v)
	}
	// /dev/shm is a tmpfs (a live_fork sandbox's RAM image lives there), not device nodes.
	if strings.HasPrefix(v, "/dev/shm/") {
		return nil
	}
	for _, reserved := range []string{"/proc", "/dev", "/sys"} {
		if v == reserved || strings.HasPrefix(v, reserved+"/") {
			return fmt.Errorf("%s %q: %s is provided by the launcher itself", flag, v, reserved)
		}
	}
	return nil
}

func hasDotSegment(p string) bool {
	for _, segment := range strings.Split(p, "/") {
		if segment == "." || segment == ".." {
			return true
		}
	}
	return false
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
		if fd == p.ListenFd {
			return fmt.Errorf("--listen-fd %d is also a --keep-fd", fd)
		}
	}
	if (p.ListenPath == "") != (p.ListenFd < 0) {
		return errors.New("--listen-socket and --listen-fd go together")
	}
	if p.ListenFd >= 0 && p.ListenFd == p.TapFd {
		return fmt.Errorf("--listen-fd %d is also the --tap-fd", p.ListenFd)
	}
	if len(p.ListenPath) > maxUnixPath {
		return fmt.Errorf("--listen-socket %q is longer than a unix socket path can be (%d bytes)", p.ListenPath, maxUnixPath)
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
