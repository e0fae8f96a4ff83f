package main

// The launch as an ordered list of steps. Each runs on the locked main OS thread, so namespace changes apply
// to the thread that finally calls execve and the program starts inside them with the launcher's pid.
//
// The privileged steps come first (they need root): namespaces, the tap, joining cgroups, handing the run
// directory over, building the mount view. Then the launcher gives up every privilege and execs.

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
	{"listen", func(p *Plan) bool { return p.ListenPath == "" }, listenUnix},
	{"cgroup", func(p *Plan) bool { return len(p.Cgroups) == 0 }, joinCgroups},
	{"fsize", func(p *Plan) bool { return p.FsizeLimit == 0 }, setFileSizeLimit},
	{"core", func(p *Plan) bool { return p.Confine == nil }, disableCoreDumps},
	{"hand-over", func(p *Plan) bool { return p.Confine == nil }, handOver},
	{"mounts", func(p *Plan) bool { return p.Confine == nil }, buildMountView},
	{"identity", func(p *Plan) bool { return p.Confine == nil }, dropPrivileges},
	{"parent-death", func(p *Plan) bool { return p.ParentPid == 0 }, dieWithParent},
	{"exec", func(*Plan) bool { return false }, execProgram},
}
