package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// The mount namespace a confined program sees: a read-only tmpfs root holding only what it was given.
//
//	/usr, /bin, /lib... (ro)      the system's programs and libraries (the merged-/usr links as links)
//	/etc/ld.so.cache (ro)         so the dynamic loader finds the libraries
//	<run dir> (rw)                its own sockets and disk overlay, chowned to it (confine.go)
//	--own files (rw)              files it writes outside its run directory (a snapshot parent's RAM file)
//	--ro paths (ro)               what it reads: memory images, disk layers, kernel, initrd (symlinks kept)
//	--ro-exec files (ro, exec)    a library it preloads
//	/dev: null zero full random urandom (+ --dev nodes)
//	/proc                         a new procfs that shows only its own processes (hidepid=invisible)
//
// Every path keeps its host name, so the program's command line is the same inside and out.

// stagingRoot is where the new root is assembled before pivot_root. Sources are opened (O_PATH) before it is
// mounted over, so a source below it (a home under /tmp) is still found.
const stagingRoot = "/tmp"

const maxSymlinkHops = 8

// O_PATH from <fcntl.h> (x86-64); Go 1.19's syscall package has no constant for it.
const oPath = 0x200000

type viewEntry struct {
	target   string
	fd       int    // O_PATH fd of the source; -1 for a symlink
	link     string // symlink target
	dir      bool
	writable bool
	exec     bool
	device   bool
}

var systemDirs = []string{"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

var standardDevices = []string{"null", "zero", "full", "random", "urandom"}

func buildMountView(p *Plan) error {
	program, err := resolveProgram(p.Program)
	if err != nil {
		return err
	}
	p.Program = program
	if err := syscall.Unshare(syscall.CLONE_NEWNS | syscall.CLONE_FS); err != nil {
		return fmt.Errorf("unshare(CLONE_NEWNS): %w", err)
	}
	// The directories made for the view must be 0755 whatever umask the daemon runs with (its systemd unit's
	// UMask=0027 made them 0750: the confined uid could not reach its own run directory). The program gets the
	// inherited umask back.
	defer syscall.Umask(syscall.Umask(0o022))
	// Nothing mounted from here on propagates to the host, and nothing of the host's later mounts reaches in.
	if err := syscall.Mount("none", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// Opened inside the new namespace: a bind mount's source must be a mount of the caller's namespace.
	entries, err := collectView(p)
	if err != nil {
		return err
	}
	defer func() {
		for _, e := range entries {
			if e.fd >= 0 {
				syscall.Close(e.fd)
			}
		}
	}()
	if err := syscall.Mount("tmpfs", stagingRoot, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", stagingRoot, err)
	}
	for _, e := range entries {
		if err := placeEntry(e); err != nil {
			return err
		}
	}
	if err := mountProc(); err != nil {
		return err
	}
	return pivotInto(stagingRoot)
}

func resolveProgram(program string) (string, error) {
	if !strings.HasPrefix(program, "/") {
		found, err := exec.LookPath(program)
		if err != nil {
			return "", err
		}
		program = found
	}
	return filepath.Abs(program)
}

// collectView lists what the new root holds and opens every source, before anything is mounted.
func collectView(p *Plan) ([]viewEntry, error) {
	var entries []viewEntry
	add := func(target string, writable, exec, device bool) error {
		info, err := os.Lstat(target)
		if err != nil {
			return err
		}
		fd, err := syscall.Open(target, oPath|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", target, err)
		}
		entries = append(entries, viewEntry{target: target, fd: fd, dir: info.IsDir(), writable: writable, exec: exec, device: device})
		return nil
	}
	if err := add("/usr", false, true, false); err != nil {
		return nil, err
	}
	for _, dir := range systemDirs {
		info, err := os.Lstat(dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, err
		case info.Mode()&os.ModeSymlink != 0:
			link, err := os.Readlink(dir)
			if err != nil {
				return nil, err
			}
			entries = append(entries, viewEntry{target: dir, fd: -1, link: link})
		default:
			if err := add(dir, false, true, false); err != nil {
				return nil, err
			}
		}
	}
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		if err := add("/etc/ld.so.cache", false, false, false); err != nil {
			return nil, err
		}
	}
	if err := add(p.Program, false, true, false); err != nil {
		return nil, err
	}
	if err := add(p.Confine.RunDir, true, false, false); err != nil {
		return nil, err
	}
	for _, file := range p.Confine.Own {
		if err := add(file, true, false, false); err != nil {
			return nil, err
		}
	}
	for _, path := range p.Confine.ReadOnly {
		if err := addReadOnly(&entries, add, path); err != nil {
			return nil, err
		}
	}
	for _, lib := range p.Confine.Libraries {
		if err := add(lib, false, true, false); err != nil {
			return nil, err
		}
	}
	for _, name := range append(append([]string{}, standardDevices...), p.Confine.Devices...) {
		if err := add("/dev/"+name, true, false, true); err != nil {
			return nil, err
		}
	}
	return dedupe(entries), nil
}

// addReadOnly adds a read-only path; a symlink is kept as a symlink and what it points to is added too.
func addReadOnly(entries *[]viewEntry, add func(string, bool, bool, bool) error, path string) error {
	for hop := 0; hop <= maxSymlinkHops; hop++ {
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		if info.Mode()&os.ModeSymlink == 0 {
			return add(path, false, false, false)
		}
		link, err := os.Readlink(path)
		if err != nil {
			return err
		}
		*entries = append(*entries, viewEntry{target: path, fd: -1, link: link})
		if !filepath.IsAbs(link) {
			link = filepath.Join(filepath.Dir(path), link)
		}
		path = filepath.Clean(link)
	}
	return fmt.Errorf("--ro: more than %d symlinks", maxSymlinkHops)
}

// dedupe sorts entries parents-first and drops those already visible through an earlier one (a path below a
// bound directory or a symlink, or the same path twice).
func dedupe(entries []viewEntry) []viewEntry {
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].target < entries[j].target })
	var kept []viewEntry
	for _, e := range entries {
		covered := false
		for _, k := range kept {
			if e.target == k.target || ((k.dir || k.fd < 0) && strings.HasPrefix(e.target, k.target+"/")) {
				covered = true
				break
			}
		}
		if covered {
			if e.fd >= 0 {
				syscall.Close(e.fd)
			}
			continue
		}
		kept = append(kept, e)
	}
	return kept
}

func placeEntry(e viewEntry) error {
	at := stagingRoot + e.target
	if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
		return err
	}
	if e.fd < 0 {
		return os.Symlink(e.link, at)
	}
	if e.dir {
		if err := os.Mkdir(at, 0o755); err != nil {
			return err
		}
	} else if err := os.WriteFile(at, nil, 0o600); err != nil {
		return err
	}
	source := fmt.Sprintf("/proc/self/fd/%d", e.fd)
	if err := syscall.Mount(source, at, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", e.target, err)
	}
	flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_NOSUID)
	if !e.writable {
		flags |= syscall.MS_RDONLY
	}
	if !e.exec {
		flags |= syscall.MS_NOEXEC
	}
	if !e.device {
		flags |= syscall.MS_NODEV
	}
	if err := syscall.Mount("", at, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s: %w", e.target, err)
	}
	return nil
}

// mountProc: a procfs of its own in which the program sees only its own processes (and, with subset=pid where
// the kernel has it (5.8), none of /proc's system-wide files).
func mountProc() error {
	at := stagingRoot + "/proc"
	if err := os.Mkdir(at, 0o555); err != nil {
		return err
	}
	flags := uintptr(syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC)
	err := syscall.Mount("proc", at, "proc", flags, "hidepid=invisible,subset=pid")
	if errors.Is(err, syscall.EINVAL) {
		err = syscall.Mount("proc", at, "proc", flags, "hidepid=2")
	}
	if err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	return nil
}

// pivotInto makes root the process's / and detaches the old root entirely (not a chroot: nothing of it stays
// reachable), then makes the new root itself read-only.
func pivotInto(root string) error {
	if err := syscall.Chdir(root); err != nil {
		return err
	}
	if err := syscall.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := syscall.Unmount(".", syscall.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	if err := syscall.Chdir("/"); err != nil {
		return err
	}
	flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV)
	if err := syscall.Mount("", "/", "", flags, ""); err != nil {
		return fmt.Errorf("make the new root read-only: %w", err)
	}
	return nil
}
