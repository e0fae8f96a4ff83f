package main

// The launch as an ordered list of steps. Each runs on the locked main OS thread, so namespace changes apply
// to the thread that finally calls execve and the program starts inside them with the launcher's pid.
//
// Where later steps go (confinement): join the sandbox's cgroup before exec, a private mount namespace,
// dropping to an unprivileged uid/gid with no capabilities and no_new_privs. They slot in between "tap"
// (which needs the privileges) and "exec".

type step struct {
	name string
	// skip reports whether the plan does not ask for this step.
	skip func(*Plan) bool
	run  func(*Plan) error
}

var steps = []step{
	{"fds", func(*Plan) bool { return false }, closeInheritedFds},
	{"netns", func(p *Plan) bool { return p.NetnsPath == "" && !p.NewNetns }, enterNetns},
	{"sysctl", func(p *Plan) bool { return len(p.Sysctls) == 0 }, writeSysctls},
	{"tap", func(p *Plan) bool { return p.TapName == "" }, openTap},
	{"exec", func(*Plan) bool { return false }, execProgram},
}
