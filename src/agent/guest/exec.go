package main

import (
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"forkd/src/agent/guest/protocol"
)

// Exec runs a program in its own session (so a timeout or cancel kills everything it started), streams its
// output as events as it is produced, and feeds it stdin from the body or from `in` frames. It answers after
// the process exited and its output pipes closed. The process belongs to the call: cancel, a host disconnect
// or a restore kills its process group.
func (a *Agent) Exec(c *Call, args *protocol.ExecArgs, body []byte) (*protocol.ExecResult, []byte, error) {
	started := time.Now()
	if args.Stdin != "body" && len(body) > 0 {
		return nil, nil, invalidArgument(`exec: a request body is only allowed with stdin "body"`)
	}
	l, err := prepareLaunch("exec", args.Argv, args.Env, args.Cwd, args.User, nil)
	if err != nil {
		return nil, nil, err
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		return nil, nil, err
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		for _, f := range []*os.File{stdinR, stdinW, stdoutR, stdoutW} {
			f.Close()
		}
		return nil, nil, err
	}
	exited := make(chan syscall.WaitStatus, 1)
	pid, err := a.reaper.Spawn(l.path, l.argv, l.sysAttr([]uintptr{stdinR.Fd(), stdoutW.Fd(), stderrW.Fd()}, false),
		func(ws syscall.WaitStatus) { exited <- ws })
	stdinR.Close()
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		stderrR.Close()
		return nil, nil, spawnError("exec", args.Argv[0], err)
	}

	var stdoutBytes, stderrBytes int64
	var wg sync.WaitGroup
	wg.Add(2)
	go c.pump(stdoutR, "stdout", &stdoutBytes, &wg)
	go c.pump(stderrR, "stderr", &stderrBytes, &wg)
	go feedStdin(c, args.Stdin, body, stdinW)

	var exitMu sync.Mutex
	reaped := false
	kill := func() {
		exitMu.Lock()
		defer exitMu.Unlock()
		if !reaped {
			killGroup(pid, syscall.SIGKILL)
		}
	}
	timedOut := false
	timer := time.AfterFunc(time.Duration(args.TimeoutMs)*time.Millisecond, func() {
		exitMu.Lock()
		timedOut = true
		exitMu.Unlock()
		kill()
	})
	outputDone := make(chan struct{})
	go func() { wg.Wait(); close(outputDone) }()

	var status syscall.WaitStatus
	waiting := c.Done()
	for gotExit, gotOutput := false, false; !gotExit || !gotOutput; {
		select {
		case status = <-exited:
			exitMu.Lock()
			reaped = true
			exitMu.Unlock()
			gotExit = true
		case <-outputDone:
			gotOutput = true
			outputDone = nil
		case <-waiting:
			waiting = nil
			kill()
			// Grandchildren in the same group were killed too; their pipes close, so the wait ends.
		}
	}
	timer.Stop()
	select {
	case <-c.Done():
		return nil, nil, c.cancelError()
	default:
	}
	exitCode, signal := exitOf(status)
	exitMu.Lock()
	out := &protocol.ExecResult{
		ExitCode: exitCode, Signal: signal, TimedOut: timedOut,
		DurationMs: float64(time.Since(started).Microseconds()) / 1000, StdoutBytes: stdoutBytes, StderrBytes: stderrBytes,
	}
	exitMu.Unlock()
	return out, nil, nil
}

// pump forwards a pipe as events, pausing while the host is behind (more than the high-water mark queued).
func (c *Call) pump(r *os.File, ev string, count *int64, wg *sync.WaitGroup) {
	defer wg.Done()
	defer r.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			*count += int64(n)
			c.Emit(ev, append([]byte(nil), buf[:n]...))
			c.WaitForRoom()
		}
		if err != nil {
			return
		}
	}
}

// feedStdin writes the body or the `in` frames to the process, acknowledging what it consumed.
func feedStdin(c *Call, mode string, body []byte, w *os.File) {
	defer w.Close()
	switch mode {
	case "none":
		return
	case "body":
		_, _ = w.Write(body) // EPIPE: the process exited without reading; its business
		return
	}
	broken := false
	for {
		chunk, ok := c.NextInput()
		if !ok {
			return
		}
		if len(chunk.data) > 0 {
			if !broken {
				if _, err := w.Write(chunk.data); err != nil {
					broken = err != io.ErrShortWrite
				}
			}
			c.AckInput(len(chunk.data))
		}
		if chunk.eof {
			return
		}
	}
}
