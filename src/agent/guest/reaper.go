package main

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Reaper is the one place that waits for children. As PID 1 the agent inherits every orphan of the guest,
// so it reaps with wait4(-1) on SIGCHLD and hands each status to whoever started that pid; statuses of pids
// nobody owns (orphans) are dropped. Nothing else may wait: os/exec's Cmd.Wait would race this.
type Reaper struct {
	mu     sync.Mutex
	owners map[int]func(syscall.WaitStatus)
}

func newReaper() *Reaper {
	r := &Reaper{owners: map[int]func(syscall.WaitStatus){}}
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		for range ch {
			r.reap()
		}
	}()
	return r
}

func (r *Reaper) reap() {
	for {
		var status syscall.WaitStatus
		r.mu.Lock()
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			r.mu.Unlock()
			continue
		}
		if pid <= 0 || err != nil {
			r.mu.Unlock()
			return
		}
		owner := r.owners[pid]
		delete(r.owners, pid)
		r.mu.Unlock()
		if owner != nil {
			owner(status)
		}
	}
}

// Spawn starts a process with fork/exec (Go uses clone(CLONE_VFORK|CLONE_VM): the parent's memory is not
// copied) and registers onExit before the reaper can see the pid.
func (r *Reaper) Spawn(path string, argv []string, attr *syscall.ProcAttr, onExit func(syscall.WaitStatus)) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil {
		return 0, err
	}
	r.owners[pid] = onExit
	return pid, nil
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGILL: "SIGILL",
	syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE",
	syscall.SIGKILL: "SIGKILL", syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM", syscall.SIGSTKFLT: "SIGSTKFLT",
	syscall.SIGCHLD: "SIGCHLD", syscall.SIGCONT: "SIGCONT", syscall.SIGSTOP: "SIGSTOP", syscall.SIGTSTP: "SIGTSTP",
	syscall.SIGTTIN: "SIGTTIN", syscall.SIGTTOU: "SIGTTOU", syscall.SIGURG: "SIGURG", syscall.SIGXCPU: "SIGXCPU",
	syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGVTALRM: "SIGVTALRM", syscall.SIGPROF: "SIGPROF", syscall.SIGWINCH: "SIGWINCH",
	syscall.SIGIO: "SIGIO", syscall.SIGPWR: "SIGPWR", syscall.SIGSYS: "SIGSYS",
}

func signalName(sig syscall.Signal) string {
	if name, ok := signalNames[sig]; ok {
		return name
	}
	return "SIG" + sig.String()
}

// exitOf is (exit code, signal name) of a wait status; one of them is nil.
func exitOf(status syscall.WaitStatus) (*int64, *string) {
	if status.Signaled() {
		name := signalName(status.Signal())
		return nil, &name
	}
	code := int64(status.ExitStatus())
	return &code, nil
}
