// Command forkd-agent is the guest agent: one static binary (no libc, no interpreter needed) that serves the
// agent protocol on the virtio-serial port org.forkd.agent, and as PID 1 of the guest reaps every orphan.
//
//	forkd-agent                  serve on the virtio-serial port, system fix-ups
//	forkd-agent --stdio          serve on stdin/stdout (host tests), dry-run fix-ups
//	forkd-agent --self-test      check the system calls in this root, print JSON, exit
//
// Options: --template <template.json> --worker <worker.py> --python <python3> --fixups system|dry-run
// --port-name <virtio port name> --no-prime. Logs are JSON lines on stderr.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"
)

// memoryLimit: no periodic GC (GOGC off, so an idle child's Go runtime has no collection timer to fire);
// the heap is collected when it reaches this size instead.
const memoryLimit = 48 << 20

func main() {
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(memoryLimit)
	started := time.Now()
	log := &Log{}

	flags := flag.NewFlagSet("forkd-agent", flag.ContinueOnError)
	stdio := flags.Bool("stdio", false, "serve on stdin/stdout (host tests)")
	selfTestFlag := flags.Bool("self-test", false, "check the system calls, print JSON and exit")
	templatePath := flags.String("template", defaultTemplatePath, "template description")
	workerPath := flags.String("worker", "", "the Python worker (default: worker.py beside this binary)")
	python := flags.String("python", "python3", "the Python interpreter")
	fixupsKind := flags.String("fixups", "", "system or dry-run (default: system on the port, dry-run with --stdio)")
	port := flags.String("port-name", portName, "virtio-serial port name")
	noPrime := flags.Bool("no-prime", false, "skip priming the hot paths")
	if err := flags.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	// Writes to a closed stdout come back as EPIPE instead of killing the agent.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	if *selfTestFlag {
		report, err := selfTest()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		report.Agent = AgentVersion
		report.Go = runtime.Version()
		report.CloseOnExec = markInheritedCloseOnExec()
		report.Pid = os.Getpid()
		b, _ := json.Marshal(report)
		fmt.Println(string(b))
		return
	}
	if marked := markInheritedCloseOnExec(); len(marked) > 0 {
		log.Info("marked inherited descriptors close-on-exec", Fields{"fds": marked})
	}
	// Orphans of daemonizing processes come to the agent (PID 1 does this anyway) and are reaped.
	_ = setChildSubreaper()

	if *workerPath == "" {
		if exe, err := os.Executable(); err == nil {
			*workerPath = filepath.Join(filepath.Dir(exe), "worker.py")
		}
	}
	template := readTemplate(*templatePath)
	if template.Problem != "" {
		log.Error("template description unusable", Fields{"problem": template.Problem})
	}
	applyTemplateDefaults(template)
	agent := &Agent{template: template, reaper: newReaper(), startedAt: started}
	agent.procs = newProcTable(agent)
	// The interpreter starts first: it is the slow part of a cold boot and must be warm by the snapshot.
	if template.Interpreter == "python" {
		agent.python = newPython(agent, log, *python, *workerPath)
		agent.python.Start()
	}
	kind := *fixupsKind
	if kind == "" {
		kind = "system"
		if *stdio {
			kind = "dry-run"
		}
	}
	switch kind {
	case "dry-run":
		agent.fixups = dryRunFixups{}
	case "system":
		f, err := newSystemFixups()
		if err != nil {
			log.Error("cannot set up the system fix-ups", Fields{"error": err.Error()})
			agent.fixups = unavailableFixups{reason: err.Error()}
		} else {
			agent.fixups = f
		}
	default:
		fmt.Fprintf(os.Stderr, "--fixups must be \"system\" or \"dry-run\", not %q\n", kind)
		os.Exit(2)
	}

	var tr *Transport
	if *stdio {
		tr = newTransport(log, os.Stdin, os.Stdout, false)
	} else {
		tr = openPort(log, *port)
	}
	shutdownNow := make(chan string, 4)
	server := newServer(agent, log, tr, func() { shutdownNow <- "input closed" })
	agent.server = server
	signals := make(chan os.Signal, 4)
	// SIGTERM and the signals busybox's halt/poweroff/reboot send to PID 1.
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPWR)
	go func() {
		for sig := range signals {
			shutdownNow <- signalName(sig.(syscall.Signal))
		}
	}()
	// Before the hello: the host snapshots a parent only after it, so the primed state is in every child.
	if !*noPrime {
		primeHotPaths(server, agent, log)
	}
	server.Start()
	log.Info("agent started", Fields{"version": AgentVersion, "template": template.Name, "interpreter": template.Interpreter,
		"fixups": agent.fixups.Kind(), "transport": map[bool]string{true: "stdio", false: "virtio-serial"}[*stdio], "pid": os.Getpid()})
	shutdown(agent, log, <-shutdownNow)
}

func setChildSubreaper() error {
	const prSetChildSubreaper = 36
	_, _, e := syscall.Syscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	if e != 0 {
		return e
	}
	return nil
}

// shutdown ends every process (SIGTERM, then SIGKILL), stops the interpreter and, as PID 1, syncs and
// powers the VM off (PID 1 must never exit: the kernel would panic).
func shutdown(agent *Agent, log *Log, why string) {
	log.Info("shutting down", Fields{"why": why})
	agent.server.detachAll(nil)
	if agent.python != nil {
		agent.python.Stop()
	}
	agent.procs.killAll(syscall.SIGTERM)
	if os.Getpid() == 1 {
		_ = syscall.Kill(-1, syscall.SIGTERM)
		time.Sleep(500 * time.Millisecond)
		_ = syscall.Kill(-1, syscall.SIGKILL)
		syscall.Sync()
		_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
		select {}
	}
	// Let the kills reach their process groups before this process goes away.
	time.Sleep(50 * time.Millisecond)
	agent.procs.killAll(syscall.SIGKILL)
	os.Exit(0)
}
