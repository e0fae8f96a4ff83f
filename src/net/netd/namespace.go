package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Where named namespaces live, as iproute2 (`ip netns`) keeps them: the daemon, the launcher and ip all agree.
const netnsDir = "/run/netns"

var netnsDirOnce sync.Once
var netnsDirErr error

// prepareNetnsDir makes /run/netns a shared mount point, as `ip netns add` does, so a namespace bind-mounted
// there later is seen by mount namespaces created earlier.
func prepareNetnsDir() error {
	netnsDirOnce.Do(func() {
		if err := os.MkdirAll(netnsDir, 0o755); err != nil {
			netnsDirErr = err
			return
		}
		err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if errors.Is(err, unix.EINVAL) { // not a mount point yet
			if err = unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
				err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
			}
		}
		if err != nil {
			netnsDirErr = fmt.Errorf("making %s a shared mount: %w", netnsDir, err)
		}
	})
	return netnsDirErr
}

// createNamedNetns creates namespace `name` and returns a handle to it, leaving the calling (locked) thread
// in the namespace it started in. On failure nothing is left behind.
func createNamedNetns(name string) (netns.NsHandle, error) {
	if err := prepareNetnsDir(); err != nil {
		return netns.None(), err
	}
	origin, err := netns.Get()
	if err != nil {
		return netns.None(), err
	}
	defer origin.Close()
	file := filepath.Join(netnsDir, name)
	f, err := os.OpenFile(file, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		return netns.None(), fmt.Errorf("netns %s: %w", name, err)
	}
	f.Close()
	created, err := enterNewNetns(file)
	if restoreErr := netns.Set(origin); restoreErr != nil && err == nil {
		// The thread is lost to its namespace; it dies with its goroutine (locked, never unlocked).
		err = fmt.Errorf("returning to the host namespace: %w", restoreErr)
	}
	if err != nil {
		if created.IsOpen() {
			created.Close()
		}
		_ = removeNamedNetns(name)
		return netns.None(), err
	}
	return created, nil
}

// enterNewNetns unshares a new namespace on this thread and bind-mounts it onto file.
func enterNewNetns(file string) (netns.NsHandle, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return netns.None(), fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
	}
	if err := unix.Mount("/proc/thread-self/ns/net", file, "none", unix.MS_BIND, ""); err != nil {
		return netns.None(), fmt.Errorf("bind-mounting %s: %w", file, err)
	}
	return netns.Get()
}

// removeNamedNetns unmounts and removes the namespace's file; what is already gone is skipped.
func removeNamedNetns(name string) error {
	file := filepath.Join(netnsDir, name)
	if err := unix.Unmount(file, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", file, err)
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// enterNamedNetns moves the calling (locked, never unlocked) thread into namespace `name` for good.
func enterNamedNetns(name string) error {
	h, err := netns.GetFromPath(filepath.Join(netnsDir, name))
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return fmt.Errorf("setns %s: %w", name, err)
	}
	return nil
}

// writeSysctls writes net.* settings of the thread's namespace (/proc/sys/net is resolved per opening task).
func writeSysctls(sysctls [][2]string) error {
	for _, s := range sysctls {
		file := filepath.Join("/proc/sys", strings.ReplaceAll(s[0], ".", "/"))
		if err := os.WriteFile(file, []byte(s[1]+"\n"), 0); err != nil {
			return fmt.Errorf("%s=%s: %w", s[0], s[1], err)
		}
	}
	return nil
}
