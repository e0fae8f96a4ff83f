package main

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"forkd/src/agent/guest/protocol"
)

// Python is the warm interpreter: one persistent worker.py process, started before anything else so that the
// parent VM is snapshotted with it warm. Jobs (cells and context ops) run one at a time in arrival order; a
// cell's timeout counts from when the agent received it. A timed-out or cancelled cell gets SIGINT, and if it
// does not unwind within a grace period the worker is killed and restarted (its namespaces are lost; the
// template's warm-up runs again). The grace is the worker's own CPU time after the SIGINT (interruptGrace: a
// cell that unwinds needs milliseconds of it, one that ignores the signal burns it), with a wall-clock cap
// (interruptGraceWall, inside the host's 10 s answer margin): a wall-clock grace alone ran out on a loaded TCG
// host before the starved worker had run at all, and lost the user's state for a cell that was unwinding.
type Python struct {
	agent  *Agent
	log    *Log
	python string
	worker string

	mu            sync.Mutex
	state         string
	ready         bool
	conn          *os.File
	pid           int
	queue         []*job
	running       *job
	nextID        int64
	crashes       []time.Time
	warmupCode    *string
	reseedPending bool
	failure       string
	stopping      bool
}

const (
	interruptGrace     = 500 * time.Millisecond
	interruptGraceWall = 6 * time.Second
	interruptPoll      = 200 * time.Millisecond
	maxCrashes         = 5
	crashWindow        = time.Minute
	restartDelay       = 100 * time.Millisecond
	maxWorkerMessage   = 64 << 20
	rewarmTimeout      = 10 * time.Minute
	maxRememberedCtxs  = 1024
)

type job struct {
	id       int64
	request  map[string]any
	call     *Call // nil for the agent's own re-warm-up
	stream   bool
	cell     bool
	reply    chan *workerReply
	timedOut bool
	settled  bool
	started  time.Time
	deadline *time.Timer
	grace    *time.Timer
}

type workerFailure struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type workerReply struct {
	ID              *int64                 `json:"id"`
	Ready           bool                   `json:"ready"`
	Stream          string                 `json:"stream"`
	Text            string                 `json:"text"`
	Result          *string                `json:"result"`
	ResultTruncated bool                   `json:"result_truncated"`
	Stdout          string                 `json:"stdout"`
	Stderr          string                 `json:"stderr"`
	StdoutTruncated bool                   `json:"stdout_truncated"`
	StderrTruncated bool                   `json:"stderr_truncated"`
	Error           *protocol.PythonError  `json:"error"`
	Formats         *protocol.RichFormats  `json:"formats"`
	ExecutionCount  *int64                 `json:"execution_count"`
	Fail            *workerFailure         `json:"fail"`
	Context         *protocol.ContextInfo  `json:"context"`
	Contexts        []protocol.ContextInfo `json:"contexts"`
	// Set by the agent for a job that ended without a worker answer.
	lost     *protocol.PythonError
	timedOut bool
}

func newPython(agent *Agent, log *Log, python, worker string) *Python {
	return &Python{agent: agent, log: log, python: python, worker: worker, state: "cold"}
}

// Warm is the interpreter's warm state (cold, warming, warm, failed).
func (p *Python) Warm() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// MarkRestored: the next cell first reseeds the PRNGs of modules the interpreter already imported.
func (p *Python) MarkRestored() {
	p.mu.Lock()
	p.reseedPending = true
	p.mu.Unlock()
}

func (p *Python) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.spawnLocked()
}

func (p *Python) spawnLocked() {
	p.ready = false
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		p.log.Error("python worker: socketpair failed", Fields{"error": err.Error()})
		p.exitedLocked(0, nil)
		return
	}
	mine := os.NewFile(uintptr(fds[0]), "worker-channel")
	theirs := fds[1]
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		mine.Close()
		syscall.Close(theirs)
		p.exitedLocked(0, nil)
		return
	}
	stdinW.Close()
	// In "/" whatever the image's working directory: the worker must start even where that directory is gone.
	rootDir := "/"
	l, err := prepareLaunch("python", []string{p.python, "-u", p.worker}, nil, &rootDir, nil, nil)
	var pid int
	if err == nil {
		// fd 1 and 2 of the worker (output of processes its cells spawn, C-level writes) go to the agent's
		// stderr: the guest console. Cell output through sys.stdout/sys.stderr is captured by the worker.
		attr := &syscall.ProcAttr{Dir: "/", Env: l.env, Files: []uintptr{stdinR.Fd(), 2, 2, uintptr(theirs)}}
		// The callback locks p.mu before it reads pid: this function holds p.mu until pid is recorded.
		pid, err = p.agent.reaper.Spawn(l.path, l.argv, attr, func(ws syscall.WaitStatus) {
			p.mu.Lock()
			defer p.mu.Unlock()
			if pid == p.pid {
				p.exitedLocked(pid, &ws)
			}
		})
	}
	stdinR.Close()
	syscall.Close(theirs)
	if err != nil {
		mine.Close()
		p.log.Error("python worker failed to start", Fields{"error": err.Error(), "python": p.python})
		p.exitedLocked(0, nil)
		return
	}
	p.pid = pid
	p.conn = mine
	go p.readLoop(pid, mine)
}

func (p *Python) readLoop(pid int, conn *os.File) {
	var prefix [4]byte
	for {
		if _, err := io.ReadFull(conn, prefix[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(prefix[:])
		if size > maxWorkerMessage {
			p.log.Error("python worker sent an oversize message; restarting it", Fields{"size": size})
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return
		}
		buf := make([]byte, size)
		if _, err := io.ReadFull(conn, buf); err != nil {
			return
		}
		var reply workerReply
		if err := json.Unmarshal(buf, &reply); err != nil {
			p.log.Error("python worker sent invalid JSON; restarting it", Fields{"error": err.Error()})
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return
		}
		p.onReply(pid, &reply)
	}
}

func (p *Python) onReply(pid int, reply *workerReply) {
	p.mu.Lock()
	if pid != p.pid {
		p.mu.Unlock()
		return
	}
	if reply.Ready {
		p.ready = true
		p.log.Info("python worker ready", Fields{"pid": pid})
		p.pumpLocked()
		p.mu.Unlock()
		return
	}
	j := p.running
	if j == nil || reply.ID == nil || *reply.ID != j.id {
		p.mu.Unlock()
		p.log.Warn("python worker reply for no running job", nil)
		return
	}
	if reply.Stream != "" {
		// Streamed output of a running cell (a line of stdout or stderr, or a display output's JSON); waiting for
		// room pauses the worker (its writes block).
		p.mu.Unlock()
		if j.stream && j.call != nil && (reply.Stream == "stdout" || reply.Stream == "stderr" || reply.Stream == "display") {
			j.call.Emit(reply.Stream, []byte(reply.Text))
			j.call.WaitForRoom()
		}
		return
	}
	p.running = nil
	if j.grace != nil {
		j.grace.Stop()
	}
	p.settleLocked(j, reply)
	p.pumpLocked()
	p.mu.Unlock()
}

func (p *Python) settleLocked(j *job, reply *workerReply) {
	if j.settled {
		return
	}
	j.settled = true
	if j.deadline != nil {
		j.deadline.Stop()
	}
	reply.timedOut = j.timedOut
	j.reply <- reply
}

func (p *Python) pumpLocked() {
	if !p.ready || p.running != nil || p.conn == nil || len(p.queue) == 0 {
		return
	}
	j := p.queue[0]
	p.queue = p.queue[1:]
	j.started = time.Now()
	if j.cell {
		j.request["reseed"] = p.reseedPending
		p.reseedPending = false
	}
	p.running = j
	data, err := json.Marshal(j.request)
	if err != nil {
		p.running = nil
		p.settleLocked(j, &workerReply{lost: &protocol.PythonError{Type: "InternalError", Message: err.Error()}})
		return
	}
	msg := make([]byte, 4+len(data))
	binary.BigEndian.PutUint32(msg, uint32(len(data)))
	copy(msg[4:], data)
	conn := p.conn
	// The worker reads each request whole before it answers, so this write does not wait on the worker's
	// output; it runs off the lock anyway so a stuck worker cannot wedge the agent.
	go func() { _, _ = conn.Write(msg) }()
}

// submit queues a job and waits for its reply, its timeout or the call's end.
func (p *Python) submit(c *Call, request map[string]any, cell bool, stream bool, timeout time.Duration) (*workerReply, error) {
	p.mu.Lock()
	if p.failure != "" {
		failure := p.failure
		p.mu.Unlock()
		return nil, newError(protocol.CodeUnavailable, "%s", failure)
	}
	p.nextID++
	j := &job{id: p.nextID, request: request, call: c, cell: cell, stream: stream, reply: make(chan *workerReply, 1)}
	request["id"] = j.id
	if timeout > 0 {
		j.deadline = time.AfterFunc(timeout, func() { p.onDeadline(j, timeout) })
	}
	p.queue = append(p.queue, j)
	p.pumpLocked()
	p.mu.Unlock()
	var done <-chan struct{}
	if c != nil {
		done = c.Done()
	}
	select {
	case reply := <-j.reply:
		return reply, nil
	case <-done:
		p.onCancel(j)
		return nil, c.cancelError()
	}
}

func (p *Python) onDeadline(j *job, timeout time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if j.settled {
		return
	}
	j.timedOut = true
	if p.running == j {
		p.interruptLocked(j)
		return
	}
	p.removeQueuedLocked(j)
	p.settleLocked(j, &workerReply{lost: &protocol.PythonError{
		Type:    "TimeoutError",
		Message: "the cell did not start within " + timeout.String() + ": the interpreter was busy with earlier cells",
	}})
}

func (p *Python) onCancel(j *job) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if j.settled {
		return
	}
	if p.running == j {
		if j.cell {
			p.interruptLocked(j)
		}
	} else {
		p.removeQueuedLocked(j)
	}
	// The caller is answered at once; a running cell keeps the interpreter busy until it has unwound.
	j.settled = true
	if j.deadline != nil {
		j.deadline.Stop()
	}
}

func (p *Python) removeQueuedLocked(j *job) {
	for i, q := range p.queue {
		if q == j {
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			return
		}
	}
}

// interruptLocked: SIGINT now (a KeyboardInterrupt in the cell), SIGKILL if it has not unwound after the grace.
func (p *Python) interruptLocked(j *job) {
	if p.pid <= 0 {
		return
	}
	pid := p.pid
	_ = syscall.Kill(pid, syscall.SIGINT)
	if j.grace != nil {
		return
	}
	since := time.Now()
	cpuAtInterrupt, _ := processCPUTime(pid)
	j.grace = time.AfterFunc(interruptPoll, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.running != j || p.pid != pid {
			return
		}
		cpu, ok := processCPUTime(pid)
		if ok && cpu-cpuAtInterrupt < interruptGrace && time.Since(since) < interruptGraceWall {
			j.grace.Reset(interruptPoll)
			return
		}
		p.log.Warn("cell ignored SIGINT; killing the python worker", Fields{"id": j.id})
		_ = syscall.Kill(pid, syscall.SIGKILL)
	})
}

func (p *Python) exitedLocked(pid int, ws *syscall.WaitStatus) {
	if p.conn != nil {
		p.conn.Close()
	}
	p.conn = nil
	p.pid = -1
	p.ready = false
	if j := p.running; j != nil {
		p.running = nil
		if j.grace != nil {
			j.grace.Stop()
		}
		how := "could not be started"
		if ws != nil {
			if ws.Signaled() {
				how = "was killed by " + signalName(ws.Signal())
			} else {
				how = "exited with code " + itoa(ws.ExitStatus())
			}
		}
		lost := &protocol.PythonError{Type: "InterpreterDied", Message: "the Python interpreter " + how + " while running the cell; it was restarted and its state lost"}
		if j.timedOut {
			lost = &protocol.PythonError{Type: "TimeoutError", Message: "the cell ignored the interrupt after its timeout; the interpreter was restarted and its state lost"}
		}
		p.settleLocked(j, &workerReply{lost: lost})
	}
	if p.stopping {
		return
	}
	now := time.Now()
	recent := p.crashes[:0]
	for _, t := range p.crashes {
		if now.Sub(t) < crashWindow {
			recent = append(recent, t)
		}
	}
	p.crashes = append(recent, now)
	p.log.Warn("python worker exited", Fields{"recent_exits": len(p.crashes)})
	if len(p.crashes) > maxCrashes {
		p.failure = "the Python worker exited " + itoa(len(p.crashes)) + " times within a minute; not restarting it"
		p.state = "failed"
		for _, q := range p.queue {
			p.settleLocked(q, &workerReply{lost: &protocol.PythonError{Type: "InterpreterDied", Message: p.failure}})
		}
		p.queue = nil
		return
	}
	p.state = "cold"
	time.AfterFunc(restartDelay, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.stopping {
			return
		}
		p.spawnLocked()
		p.rewarmLocked()
	})
}

// rewarmLocked runs the last warm-up code ahead of queued cells after a restart.
func (p *Python) rewarmLocked() {
	if p.warmupCode == nil {
		return
	}
	p.state = "warming"
	p.nextID++
	j := &job{id: p.nextID, cell: true, reply: make(chan *workerReply, 1)}
	j.request = p.cellRequest(*p.warmupCode, nil, true, false)
	j.request["id"] = j.id
	p.queue = append([]*job{j}, p.queue...)
	go func() {
		reply := <-j.reply
		p.mu.Lock()
		if reply.lost == nil && reply.Error == nil {
			p.state = "warm"
		} else {
			p.state = "failed"
		}
		p.mu.Unlock()
	}()
	p.pumpLocked()
}

func (p *Python) cellRequest(code string, args *protocol.EvalArgs, warmup bool, stream bool) map[string]any {
	req := map[string]any{
		"op": "cell", "code": code, "max_chars": protocol.MaxEvalOutputChars,
		"max_traceback": protocol.MaxTracebackChars, "stream": stream, "warmup": warmup,
	}
	if args != nil {
		if args.Context != nil {
			req["context"] = *args.Context
		}
		if args.Cwd != nil {
			req["cwd"] = *args.Cwd
		}
		if args.Env != nil {
			req["env"] = args.Env
		}
	}
	return req
}

// Cell runs code and converts the worker's reply to an EvalResult.
func (p *Python) Cell(c *Call, code string, args *protocol.EvalArgs, timeoutMs int64, warmup bool) (*protocol.EvalResult, error) {
	stream := args != nil && args.Stream != nil && *args.Stream
	received := time.Now()
	reply, err := p.submit(c, p.cellRequest(code, args, warmup, stream), true, stream, time.Duration(timeoutMs)*time.Millisecond)
	if err != nil {
		return nil, err
	}
	if reply.Fail != nil {
		return nil, newError(reply.Fail.Code, "eval: %s", reply.Fail.Message)
	}
	result := &protocol.EvalResult{
		Result: reply.Result, ResultTruncated: reply.ResultTruncated,
		Stdout: reply.Stdout, Stderr: reply.Stderr, StdoutTruncated: reply.StdoutTruncated, StderrTruncated: reply.StderrTruncated,
		Error: reply.Error, Formats: reply.Formats, ExecutionCount: reply.ExecutionCount,
		TimedOut: reply.timedOut, DurationMs: float64(time.Since(received).Microseconds()) / 1000,
	}
	if reply.lost != nil {
		result = &protocol.EvalResult{Error: reply.lost, TimedOut: reply.timedOut, DurationMs: result.DurationMs}
	}
	return result, nil
}

// Warmup runs the template's warm-up and records the warm state; a worker restart runs it again.
func (p *Python) Warmup(c *Call, code string, timeoutMs int64) (*protocol.EvalResult, error) {
	p.mu.Lock()
	p.warmupCode = &code
	p.state = "warming"
	p.mu.Unlock()
	result, err := p.Cell(c, code, nil, timeoutMs, true)
	p.mu.Lock()
	if err == nil && result.Error == nil {
		p.state = "warm"
	} else {
		p.state = "failed"
	}
	p.mu.Unlock()
	return result, err
}

// ContextOp runs a context.* request in the worker (queued behind cells, like any job).
func (p *Python) ContextOp(c *Call, op string, fields map[string]any) (*workerReply, error) {
	fields["op"] = op
	reply, err := p.submit(c, fields, false, false, 0)
	if err != nil {
		return nil, err
	}
	if reply.lost != nil {
		return nil, newError(protocol.CodeUnavailable, "%s: %s", op, reply.lost.Message)
	}
	if reply.Fail != nil {
		return nil, newError(reply.Fail.Code, "%s: %s", op, reply.Fail.Message)
	}
	return reply, nil
}

// Stop kills the worker and fails what is queued (shutdown).
func (p *Python) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopping = true
	if p.pid > 0 {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
	for _, j := range p.queue {
		p.settleLocked(j, &workerReply{lost: &protocol.PythonError{Type: "InterpreterDied", Message: "the agent is shutting down"}})
	}
	p.queue = nil
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
