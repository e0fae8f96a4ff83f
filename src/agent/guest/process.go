package main

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// baseEnv is what every process starts from (the request's env is laid over it).
var baseEnv = map[string]string{
	"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME": "/root",
	"LANG": "C.UTF-8",
}

// defaultCwd is where a process starts when its request names no directory: the image's working directory
// (template.json), else the user's home (root: "/").
var defaultCwd string

// launch is a resolved request to start a process: program, argv, env, cwd and credentials.
type launch struct {
	op      string
	path    string
	argv    []string
	env     []string
	cwd     string
	user    *User
	userArg string
}

// prepareLaunch resolves user, environment, working directory and program before anything is started.
func prepareLaunch(op string, argv []string, env map[string]string, cwd *string, userName *string, extra map[string]string) (*launch, error) {
	l := &launch{op: op, argv: argv, cwd: "/", userArg: "root"}
	merged := make(map[string]string, len(baseEnv)+len(env)+4)
	for k, v := range baseEnv {
		merged[k] = v
	}
	if userName != nil {
		u, err := lookupUser(op, *userName)
		if err != nil {
			return nil, err
		}
		l.user = u
		l.userArg = u.Name
		l.cwd = u.Home
		merged["HOME"] = u.Home
		merged["USER"] = u.Name
		merged["LOGNAME"] = u.Name
		if u.Shell != "" {
			merged["SHELL"] = u.Shell
		}
	}
	for k, v := range extra {
		merged[k] = v
	}
	for k, v := range env {
		merged[k] = v
	}
	if cwd != nil {
		l.cwd = *cwd
	} else if defaultCwd != "" {
		l.cwd = defaultCwd
	}
	keys := make([]string, 0, len(merged))
	for k := range merged {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		l.env = append(l.env, k+"="+merged[k])
	}
	if st, err := os.Stat(l.cwd); err != nil || !st.IsDir() {
		return nil, notFound("%s: working directory %s does not exist", op, l.cwd)
	}
	path, err := lookPath(op, argv[0], merged["PATH"], l.cwd)
	if err != nil {
		return nil, err
	}
	l.path = path
	return l, nil
}

// lookPath finds the program as execvp would: a name with a slash as given (relative to cwd), else on PATH.
func lookPath(op, name, pathEnv, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := executable(p); err != nil {
			return "", programError(op, name, err)
		}
		return p, nil
	}
	var firstErr error = syscall.ENOENT
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		err := executable(p)
		if err == nil {
			return p, nil
		}
		if err == syscall.EACCES {
			firstErr = err
		}
	}
	return "", programError(op, name, firstErr)
}

func executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return syscall.ENOENT
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return syscall.EACCES
	}
	return nil
}

func programError(op, name string, err error) error {
	if err == syscall.EACCES {
		return invalidArgument("%s: %s: permission denied", op, name)
	}
	return notFound("%s: %s: no such file or directory (not found on PATH)", op, name)
}

// sysAttr: a new session (so the pid is the process group id and a timeout kills everything it started),
// the user's credentials, and optionally a controlling terminal (fd 0 of the child).
func (l *launch) sysAttr(files []uintptr, ctty bool) *syscall.ProcAttr {
	sys := &syscall.SysProcAttr{Setsid: true}
	if ctty {
		sys.Setctty = true
		sys.Ctty = 0
	}
	if l.user != nil {
		sys.Credential = &syscall.Credential{Uid: l.user.UID, Gid: l.user.GID, Groups: l.user.Groups}
	}
	return &syscall.ProcAttr{Dir: l.cwd, Env: l.env, Files: files, Sys: sys}
}

func spawnError(op, program string, err error) error {
	switch err {
	case syscall.ENOENT:
		return notFound("%s: %s: no such file or directory (not found on PATH)", op, program)
	case syscall.EACCES:
		return invalidArgument("%s: %s: permission denied", op, program)
	}
	return newError("internal", "%s: cannot start %s: %s", op, program, err.Error())
}

// killGroup sends sig to the process group led by pid (a session leader the agent started).
func killGroup(pid int, sig syscall.Signal) {
	if pid > 0 {
		_ = syscall.Kill(-pid, sig)
	}
}
