// forkd-launcher: the small privileged step between the forkd daemon and the program it starts (QEMU, or nft
// for a sandbox's rules). It joins a sandbox's network namespace, opens the sandbox's tap there and hands it
// to the program as an inherited fd, then execs the program, which keeps the launcher's pid (the daemon
// identifies and adopts QEMU processes by pid and start time). No shell, no configuration files: everything
// comes from a declared, validated argv (plan.go).
package main

import (
	"fmt"
	"os"
	"runtime"
)

// Namespace changes made with setns/unshare apply to the calling OS thread only; everything runs on the main
// thread, which is also the thread that calls execve.
func init() { runtime.LockOSThread() }

// exitLaunchFailed is what the launcher exits with when it fails before exec (as env(1) and container
// runtimes use 125 for "the launcher itself failed", so it is not mistaken for the program's own status).
const exitLaunchFailed = 125

func main() {
	plan, err := ParsePlan(os.Args[1:])
	if err != nil {
		fail("arguments", err)
	}
	for _, s := range steps {
		if s.skip(plan) {
			continue
		}
		if err := s.run(plan); err != nil {
			fail(s.name, err)
		}
	}
}

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "forkd-launcher: %s: %v\n", step, err)
	os.Exit(exitLaunchFailed)
}
