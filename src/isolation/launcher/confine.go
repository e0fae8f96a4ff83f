package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// prctl(2) options and capability constants from <linux/prctl.h> and <linux/capability.h>.
const (
	prSetPdeathsig       = 1
	prCapbsetDrop        = 24
	prSetNoNewPrivs      = 38
	prCapAmbient         = 47
	prCapAmbientClearAll = 4
	capabilityVersion3   = 0x20080522
)

// confinedUid is the identity of a confined program: UidBase + its pid. The program keeps the launcher's pid,
// and no two live processes share a pid, so no two confined programs share a uid: one cannot signal, ptrace
// or open the files of another, whatever the mount namespace shows.
func confinedUid(p *Plan) (int, error) {
	uid := p.Confine.UidBase + os.Getpid()
	if uid > maxUid {
		return 0, fmt.Errorf("uid %d (--uid-base %d + pid %d) is above %d: lower the base", uid, p.Confine.UidBase, os.Getpid(), maxUid)
	}
	return uid, nil
}

// handOver makes the run directory reachable for the confined uid (it stays root's, mode 0710, group the
// program's own gid: the program can open what it was given there, and list, create, rename or delete
// nothing) and gives it the --own files (its disk overlay, the sockets the daemon listens on, a snapshot
// parent's RAM file). Each must be root's and not a symlink: the launcher never chowns what it was not meant to.
func handOver(p *Plan) error {
	uid, err := confinedUid(p)
	if err != nil {
		return err
	}
	dir := p.Confine.RunDir
	if err := checkRootOwned(dir, true); err != nil {
		return err
	}
	if err := os.Lchown(dir, 0, uid); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return err
	}
	for _, file := range p.Confine.Own {
		if err := checkRootOwned(file, false); err != nil {
			return err
		}
		if err := os.Lchown(file, uid, uid); err != nil {
			return err
		}
	}
	return nil
}

func checkRootOwned(path string, wantDir bool) error {
	info, err := os.Lstat(path)
	if err != nil {
		return err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return fmt.Errorf("%s: no ownership information", path)
	case wantDir && !info.IsDir():
		return fmt.Errorf("%s is not a directory", path)
	case !wantDir && (info.IsDir() || info.Mode()&os.ModeSymlink != 0):
		return fmt.Errorf("%s is a directory or a symlink, not a file to hand over", path)
	case st.Uid != 0:
		return fmt.Errorf("%s belongs to uid %d, not root: refusing to hand it over", path, st.Uid)
	}
	return nil
}

// dropPrivileges becomes the confined uid/gid with only the extra devices' groups, no capabilities at all
// (bounding, ambient, inheritable, permitted, effective) and no_new_privs, so nothing the program execs can
// gain any. Run after the mount namespace is built (which needs CAP_SYS_ADMIN).
func dropPrivileges(p *Plan) error {
	uid, err := confinedUid(p)
	if err != nil {
		return err
	}
	groups := []int{}
	for _, name := range p.Confine.Devices {
		var st syscall.Stat_t
		if err := syscall.Stat("/dev/"+name, &st); err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
		// Reached through its group (udev gives /dev/kvm to group kvm, mode 0660); never through root's group.
		if st.Gid == 0 || st.Mode&0o060 != 0o060 {
			return fmt.Errorf("/dev/%s is not open to a group (uid %d gid %d mode %o): a confined QEMU reaches it through its group, as udev sets it up (chgrp kvm /dev/%s; chmod 0660 /dev/%s)", name, st.Uid, st.Gid, st.Mode&0o777, name, name)
		}
		groups = append(groups, int(st.Gid))
	}
	// The bounding set: drop every capability the kernel knows (EINVAL marks the first one past the last).
	for c := 0; ; c++ {
		if err := prctl(prCapbsetDrop, uintptr(c), 0); err != nil {
			if errors.Is(err, syscall.EINVAL) && c > 0 {
				break
			}
			return fmt.Errorf("PR_CAPBSET_DROP %d: %w", c, err)
		}
	}
	if err := prctl(prCapAmbient, prCapAmbientClearAll, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	// Go applies these to every thread of the process (not only the one that execs).
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresgid(%d): %w", uid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresuid(%d): %w", uid, err)
	}
	// setresuid away from 0 cleared the permitted and effective sets; the inheritable set goes too.
	if err := clearCapabilities(); err != nil {
		return err
	}
	if err := prctl(prSetNoNewPrivs, 1, 0); err != nil {
		return fmt.Errorf("PR_SET_NO_NEW_PRIVS: %w", err)
	}
	if syscall.Getuid() != uid || syscall.Geteuid() != uid || syscall.Getgid() != uid {
		return fmt.Errorf("still uid %d/%d after setresuid(%d)", syscall.Getuid(), syscall.Geteuid(), uid)
	}
	return nil
}

type capHeader struct {
	version uint32
	pid     int32
}

type capData struct{ effective, permitted, inheritable uint32 }

func clearCapabilities() error {
	header := capHeader{version: capabilityVersion3}
	var data [2]capData
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&header)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return fmt.Errorf("capset: %w", errno)
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&header)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return fmt.Errorf("capget: %w", errno)
	}
	for _, d := range data {
		if d.effective|d.permitted|d.inheritable != 0 {
			return errors.New("capabilities remain after dropping them")
		}
	}
	return nil
}

// dieWithParent makes the kernel SIGKILL the program when the launcher's parent exits (for a VM that must
// not outlive the daemon or CLI that started it: a snapshot's parent, a probe). Set after the identity change,
// which resets it; a parent already gone by now (we were reparented) means exit at once.
func dieWithParent(p *Plan) error {
	if err := prctl(prSetPdeathsig, uintptr(syscall.SIGKILL), 0); err != nil {
		return fmt.Errorf("PR_SET_PDEATHSIG: %w", err)
	}
	if parent := syscall.Getppid(); parent != p.ParentPid {
		return fmt.Errorf("parent %d is gone (now %d): not starting a program that must die with it", p.ParentPid, parent)
	}
	return nil
}

func prctl(option int, arg2, arg3 uintptr) error {
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, uintptr(option), arg2, arg3, 0, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
