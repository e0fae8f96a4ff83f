// forkd-runas sets the credentials a build step runs with, then becomes the step's program:
//
//	forkd-runas UID GID GROUPS -- PROGRAM [ARG...]
//
// GROUPS is a comma-separated list of supplementary group ids (empty for none). It is bind-mounted
// read-only into a build step's sandbox (bwrap, no_new_privs), which has no setuid helper of its own to
// rely on: an image may have no su, setpriv or even a libc. Static, standard library only.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "forkd-runas: "+format+"\n", args...)
	os.Exit(126)
}

func id(s string) int {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		fail("not a numeric id: %q", s)
	}
	return int(n)
}

func main() {
	a := os.Args
	if len(a) < 6 || a[4] != "--" {
		fail("usage: forkd-runas UID GID GROUPS -- PROGRAM [ARG...]")
	}
	uid, gid := id(a[1]), id(a[2])
	groups := []int{}
	if a[3] != "" {
		for _, g := range strings.Split(a[3], ",") {
			groups = append(groups, id(g))
		}
	}
	// Groups and gid first: once the uid is dropped, the process may no longer change them.
	if err := syscall.Setgroups(groups); err != nil {
		fail("setgroups: %v", err)
	}
	if err := syscall.Setgid(gid); err != nil {
		fail("setgid %d: %v", gid, err)
	}
	if err := syscall.Setuid(uid); err != nil {
		fail("setuid %d: %v", uid, err)
	}
	program := a[5]
	if !strings.Contains(program, "/") {
		found, err := exec.LookPath(program)
		if err != nil {
			fail("%s: not found on PATH", program)
		}
		program = found
	}
	err := syscall.Exec(program, a[5:], os.Environ())
	fail("exec %s: %v", program, err)
}
