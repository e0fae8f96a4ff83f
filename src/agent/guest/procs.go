package main

import (
	"errors"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"forkd/src/agent/guest/protocol"
)

// ProcTable holds processes that outlive the call that started them (E2B's process service). A call attached
// to a process (proc.start, proc.connect) streams its output and answers when it ends; cancelling the call or
// losing the host only detaches it. Output nobody is attached to is dropped; output for a host that falls
// behind pauses the reads (the process then blocks on its writes). Exit records are kept until a caller has
// seen them, at most MaxExitedProcs (oldest dropped first).
type ProcTable struct {
	agent *Agent
	mu    sync.Mutex
	procs map[int]*Proc
	// exited, oldest first: records nobody has seen yet.
	exited []*Proc
}

// Proc is one process of the table.
type Proc struct {
	pid     int
	tag     *string
	argv    []string
	env     map[string]string
	cwd     string
	user    string
	pty     *os.File
	stdin   *os.File // pipe write end (nil without stdin); the master for a pty
	started time.Time

	mu        sync.Mutex
	attached  map[*Call]bool
	reaped    bool
	ended     bool
	end       protocol.ProcEnd
	timedOut  bool
	timer     *time.Timer
	stdinMu   sync.Mutex
	stdinShut bool
	endedCh   chan struct{}
	output    sync.WaitGroup
	// outputDone: every output stream reached its end.
	outputDone bool
}

func newProcTable(a *Agent) *ProcTable { return &ProcTable{agent: a, procs: map[int]*Proc{}} }

func (t *ProcTable) find(op string, pid *int64, tag *string) (*Proc, error) {
	if (pid == nil) == (tag == nil) {
		return nil, invalidArgument("%s: give exactly one of pid and tag", op)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if pid != nil {
		if p := t.procs[int(*pid)]; p != nil {
			return p, nil
		}
		return nil, notFound("%s: no process with pid %d", op, *pid)
	}
	var match *Proc
	for _, p := range t.procs {
		if p.tag != nil && *p.tag == *tag && (match == nil || p.started.After(match.started)) {
			match = p
		}
	}
	if match == nil {
		return nil, notFound("%s: no process with tag %q", op, *tag)
	}
	return match, nil
}

func (a *Agent) ProcStart(c *Call, args *protocol.ProcStartArgs, body []byte) (*protocol.ProcEnd, []byte, error) {
	t := a.procs
	t.mu.Lock()
	full := len(t.procs) >= protocol.MaxProcs
	t.mu.Unlock()
	if full {
		return nil, nil, newError(protocol.CodeTooManyRequests, "proc.start: the agent already holds %d processes", protocol.MaxProcs)
	}
	var extra map[string]string
	if args.Pty != nil {
		extra = map[string]string{"TERM": "xterm-256color"}
	}
	l, err := prepareLaunch("proc.start", args.Argv, args.Env, args.Cwd, args.User, extra)
	if err != nil {
		return nil, nil, err
	}
	env := args.Env
	if env == nil {
		env = map[string]string{}
	}
	p := &Proc{tag: args.Tag, argv: args.Argv, env: env, cwd: l.cwd, user: l.userArg, attached: map[*Call]bool{c: true},
		started: time.Now(), endedCh: make(chan struct{})}
	var childFiles []*os.File
	var readers []struct {
		f  *os.File
		ev string
	}
	closeAll := func(files ...*os.File) {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	if args.Pty != nil {
		master, slave, err := openPty()
		if err != nil {
			return nil, nil, newError("internal", "proc.start: cannot open a pty: %s", err.Error())
		}
		if err := setWinsize(master, args.Pty.Cols, args.Pty.Rows); err != nil {
			closeAll(master, slave)
			return nil, nil, newError("internal", "proc.start: cannot size the pty: %s", err.Error())
		}
		p.pty, p.stdin = master, master
		childFiles = []*os.File{slave, slave, slave}
		readers = append(readers, struct {
			f  *os.File
			ev string
		}{master, "pty"})
	} else {
		stdinR, stdinW, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		if args.Stdin != nil && *args.Stdin {
			p.stdin = stdinW
		} else {
			stdinW.Close()
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			closeAll(stdinR, p.stdin)
			return nil, nil, err
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll(stdinR, p.stdin, outR, outW)
			return nil, nil, err
		}
		childFiles = []*os.File{stdinR, outW, errW}
		readers = append(readers, struct {
			f  *os.File
			ev string
		}{outR, "stdout"}, struct {
			f  *os.File
			ev string
		}{errR, "stderr"})
	}
	fds := make([]uintptr, len(childFiles))
	for i, f := range childFiles {
		fds[i] = f.Fd()
	}
	var pid int
	t.mu.Lock()
	pid, err = a.reaper.Spawn(l.path, l.argv, l.sysAttr(fds, args.Pty != nil), func(ws syscall.WaitStatus) { t.onExit(p, ws) })
	if err == nil {
		p.pid = pid
		t.procs[pid] = p
	}
	t.mu.Unlock()
	seen := map[*os.File]bool{}
	for _, f := range childFiles {
		if !seen[f] {
			seen[f] = true
			f.Close()
		}
	}
	if err != nil {
		for _, r := range readers {
			r.f.Close()
		}
		if p.stdin != nil && p.stdin != p.pty {
			p.stdin.Close()
		}
		return nil, nil, spawnError("proc.start", args.Argv[0], err)
	}
	if args.TimeoutMs != nil {
		p.timer = time.AfterFunc(time.Duration(*args.TimeoutMs)*time.Millisecond, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if !p.reaped {
				p.timedOut = true
				killGroup(p.pid, syscall.SIGKILL)
			}
		})
	}
	pid64 := int64(pid)
	c.event(protocol.EventHeader{T: "evt", ID: c.ID, Ev: "started", Pid: &pid64}, nil)
	p.output.Add(len(readers))
	for _, r := range readers {
		go p.pump(r.f, r.ev)
	}
	go func() {
		p.output.Wait()
		p.mu.Lock()
		p.outputDone = true
		p.mu.Unlock()
		t.finishIfDone(p)
	}()
	return p.follow(t, c)
}

// pump forwards one output stream to every attached call, pausing while the host is behind.
func (p *Proc) pump(f *os.File, ev string) {
	defer p.output.Done()
	defer func() {
		if f != p.pty {
			f.Close()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			p.mu.Lock()
			calls := make([]*Call, 0, len(p.attached))
			for c := range p.attached {
				calls = append(calls, c)
			}
			p.mu.Unlock()
			for _, c := range calls {
				c.Emit(ev, chunk)
			}
			for _, c := range calls {
				c.WaitForRoom()
			}
		}
		if err != nil {
			// A pty master reads EIO once no slave descriptor is left: the same as EOF.
			return
		}
	}
}

func (t *ProcTable) onExit(p *Proc, ws syscall.WaitStatus) {
	// proc.start holds the table lock until it has recorded the pid.
	t.mu.Lock()
	t.mu.Unlock()
	p.mu.Lock()
	p.reaped = true
	code, sig := exitOf(ws)
	p.end = protocol.ProcEnd{Pid: int64(p.pid), ExitCode: code, Signal: sig}
	if p.timer != nil {
		p.timer.Stop()
	}
	p.mu.Unlock()
	t.finishIfDone(p)
}

// finishIfDone ends the process once it was reaped and its output drained: attached calls are answered,
// and a record nobody saw is kept for a later proc.connect.
func (t *ProcTable) finishIfDone(p *Proc) {
	p.mu.Lock()
	// Not yet reaped, or output still open (a grandchild may hold the pipe): the other event finishes it.
	if p.ended || !p.reaped || !p.outputDone {
		p.mu.Unlock()
		return
	}
	p.ended = true
	p.end.TimedOut = p.timedOut
	p.end.DurationMs = float64(time.Since(p.started).Microseconds()) / 1000
	attached := len(p.attached)
	p.mu.Unlock()
	if p.pty != nil {
		p.pty.Close()
	} else if p.stdin != nil {
		p.closeStdin()
	}
	close(p.endedCh)
	t.mu.Lock()
	defer t.mu.Unlock()
	if attached > 0 {
		// Attached callers are told now; if every one of them detaches first, follow() keeps the record.
		delete(t.procs, p.pid)
		return
	}
	t.keepExitedLocked(p)
}

func (t *ProcTable) keepExitedLocked(p *Proc) {
	t.procs[p.pid] = p
	t.exited = append(t.exited, p)
	for len(t.exited) > protocol.MaxExitedProcs {
		oldest := t.exited[0]
		t.exited = t.exited[1:]
		if t.procs[oldest.pid] == oldest {
			delete(t.procs, oldest.pid)
		}
	}
}

// follow waits (as call c, already attached) for the process's end, or detaches when the call ends first.
func (p *Proc) follow(t *ProcTable, c *Call) (*protocol.ProcEnd, []byte, error) {
	select {
	case <-p.endedCh:
		p.mu.Lock()
		end := p.end
		delete(p.attached, c)
		p.mu.Unlock()
		return &end, nil, nil
	case <-c.Done():
		p.mu.Lock()
		delete(p.attached, c)
		p.mu.Unlock()
		select {
		case <-p.endedCh:
			// Ended while detaching: nobody saw it, so the record stays for proc.connect.
			t.mu.Lock()
			if t.procs[p.pid] == nil {
				t.keepExitedLocked(p)
			}
			t.mu.Unlock()
		default:
		}
		return nil, nil, newError(protocol.CodeUnavailable, "%s: detached from process %d (it keeps running)", c.Op, p.pid)
	}
}

func (a *Agent) ProcConnect(c *Call, args *protocol.ProcSelector, body []byte) (*protocol.ProcEnd, []byte, error) {
	t := a.procs
	p, err := t.find("proc.connect", args.Pid, args.Tag)
	if err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	if p.ended {
		end := p.end
		p.mu.Unlock()
		// Seen now: the record is no longer needed.
		t.mu.Lock()
		if t.procs[p.pid] == p {
			delete(t.procs, p.pid)
		}
		for i, e := range t.exited {
			if e == p {
				t.exited = append(t.exited[:i], t.exited[i+1:]...)
				break
			}
		}
		t.mu.Unlock()
		return &end, nil, nil
	}
	p.attached[c] = true
	p.mu.Unlock()
	pid64 := int64(p.pid)
	c.event(protocol.EventHeader{T: "evt", ID: c.ID, Ev: "started", Pid: &pid64}, nil)
	return p.follow(t, c)
}

func (a *Agent) ProcList(c *Call, args *protocol.ProcListArgs, body []byte) (*protocol.ProcListResult, []byte, error) {
	t := a.procs
	t.mu.Lock()
	procs := make([]*Proc, 0, len(t.procs))
	for _, p := range t.procs {
		procs = append(procs, p)
	}
	t.mu.Unlock()
	sort.Slice(procs, func(i, j int) bool { return procs[i].pid < procs[j].pid })
	out := make([]protocol.ProcInfo, 0, len(procs))
	for _, p := range procs {
		p.mu.Lock()
		info := protocol.ProcInfo{Pid: int64(p.pid), Tag: p.tag, Argv: p.argv, Env: p.env, Cwd: p.cwd, User: p.user,
			Pty: p.pty != nil, Running: !p.reaped}
		if p.reaped {
			info.ExitCode = p.end.ExitCode
		}
		p.mu.Unlock()
		out = append(out, info)
	}
	return &protocol.ProcListResult{Processes: out}, nil, nil
}

func (p *Proc) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if !p.stdinShut && p.stdin != nil && p.stdin != p.pty {
		p.stdin.Close()
	}
	p.stdinShut = true
}

func (a *Agent) ProcInput(c *Call, args *protocol.ProcInputArgs, body []byte) (*protocol.EmptyResult, []byte, error) {
	p, err := a.procs.find("proc.input", args.Pid, args.Tag)
	if err != nil {
		return nil, nil, err
	}
	if p.stdin == nil {
		return nil, nil, invalidArgument("proc.input: process %d was started without stdin (pass stdin: true)", p.pid)
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdinShut {
		return nil, nil, newError(protocol.CodeConflict, "proc.input: stdin of process %d is closed", p.pid)
	}
	if len(body) > 0 {
		// A process that does not read would block the write: the call's end abandons it.
		stop := make(chan struct{})
		go func() {
			select {
			case <-c.Done():
				_ = p.stdin.SetWriteDeadline(time.Now())
			case <-stop:
			}
		}()
		_, err := p.stdin.Write(body)
		close(stop)
		_ = p.stdin.SetWriteDeadline(time.Time{})
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, nil, c.cancelError()
			}
			return nil, nil, newError(protocol.CodeConflict, "proc.input: process %d does not take input: %s", p.pid, err.Error())
		}
	}
	if args.Eof != nil && *args.Eof {
		if p.pty != nil {
			// A terminal's end of input is its EOF character (^D) at the start of a line.
			if _, err := p.stdin.Write([]byte{4}); err != nil {
				return nil, nil, newError(protocol.CodeConflict, "proc.input: %s", err.Error())
			}
		} else {
			p.stdinShut = true
			p.stdin.Close()
		}
	}
	return &protocol.EmptyResult{}, nil, nil
}

var signalsByName = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL, "SIGINT": syscall.SIGINT, "SIGHUP": syscall.SIGHUP,
	"SIGQUIT": syscall.SIGQUIT, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGSTOP": syscall.SIGSTOP,
	"SIGCONT": syscall.SIGCONT,
}

func (a *Agent) ProcSignal(c *Call, args *protocol.ProcSignalArgs, body []byte) (*protocol.EmptyResult, []byte, error) {
	p, err := a.procs.find("proc.signal", args.Pid, args.Tag)
	if err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Only a leader not yet reaped proves the group is still this process's.
	if p.reaped {
		return nil, nil, newError(protocol.CodeConflict, "proc.signal: process %d has exited", p.pid)
	}
	if err := syscall.Kill(-p.pid, signalsByName[args.Signal]); err != nil {
		return nil, nil, newError("internal", "proc.signal %d: %s", p.pid, err.Error())
	}
	return &protocol.EmptyResult{}, nil, nil
}

func (a *Agent) ProcResize(c *Call, args *protocol.ProcResizeArgs, body []byte) (*protocol.EmptyResult, []byte, error) {
	p, err := a.procs.find("proc.resize", args.Pid, args.Tag)
	if err != nil {
		return nil, nil, err
	}
	if p.pty == nil {
		return nil, nil, invalidArgument("proc.resize: process %d has no pty", p.pid)
	}
	p.mu.Lock()
	ended := p.ended
	p.mu.Unlock()
	if ended {
		return nil, nil, newError(protocol.CodeConflict, "proc.resize: process %d has exited", p.pid)
	}
	if err := setWinsize(p.pty, args.Cols, args.Rows); err != nil {
		return nil, nil, newError("internal", "proc.resize %d: %s", p.pid, err.Error())
	}
	return &protocol.EmptyResult{}, nil, nil
}

// killAll ends every process of the table (shutdown).
func (t *ProcTable) killAll(sig syscall.Signal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.procs {
		p.mu.Lock()
		if !p.reaped {
			killGroup(p.pid, sig)
		}
		p.mu.Unlock()
	}
}
