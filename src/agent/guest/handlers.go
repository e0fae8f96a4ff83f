package main

import (
	"os"
	"regexp"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"forkd/src/agent/guest/protocol"
)

// AgentVersion is reported in hello and ping next to the protocol version.
const AgentVersion = "0.2.0"

// Agent holds the agent's state and serves every op (protocol.Handlers).
type Agent struct {
	template  Template
	python    *Python
	fixups    Fixups
	reaper    *Reaper
	procs     *ProcTable
	server    *Server
	startedAt time.Time

	mu        sync.Mutex
	sandboxID *string
	hostname  *string
}

var _ protocol.Handlers[*Call] = (*Agent)(nil)

func (a *Agent) warmState() string {
	if a.template.Problem != "" {
		return "failed"
	}
	if a.python == nil {
		return "warm"
	}
	return a.python.Warm()
}

func (a *Agent) hello() *protocol.HelloHeader {
	a.mu.Lock()
	defer a.mu.Unlock()
	return &protocol.HelloHeader{
		T: "hello", Protocol: protocol.ProtocolVersion, AgentVersion: AgentVersion,
		Template: a.template.Name, Interpreter: a.template.Interpreter, Warm: a.warmState(), SandboxID: a.sandboxID,
	}
}

func (a *Agent) Ping(c *Call, args *protocol.PingArgs, body []byte) (*protocol.PingResult, []byte, error) {
	a.mu.Lock()
	hostname := a.hostname
	sandboxID := a.sandboxID
	a.mu.Unlock()
	name := ""
	if hostname != nil {
		name = *hostname
	} else {
		name, _ = os.Hostname()
	}
	return &protocol.PingResult{
		Protocol: protocol.ProtocolVersion, AgentVersion: AgentVersion, Template: a.template.Name,
		Interpreter: a.template.Interpreter, Warm: a.warmState(), SandboxID: sandboxID, Hostname: name,
		UptimeMs: time.Since(a.startedAt).Milliseconds(),
	}, nil, nil
}

var sandboxIDPattern = regexp.MustCompile(protocol.SandboxIDPattern)

// Restore is the post-restore fix-up, and starts a new host epoch: every other call still in flight was made
// by the host the snapshot's parent talked to, so it is detached as on a disconnect (no answers; exec
// processes killed; proc.* processes keep running).
func (a *Agent) Restore(c *Call, args *protocol.RestoreArgs, entropy []byte) (*protocol.RestoreResult, []byte, error) {
	started := time.Now()
	if !sandboxIDPattern.MatchString(args.SandboxID) {
		return nil, nil, invalidArgument("restore: invalid sandbox id %q: expected sb-<12 hex>", args.SandboxID)
	}
	if len(entropy) < protocol.MinEntropyBytes || len(entropy) > protocol.MaxEntropyBytes {
		return nil, nil, invalidArgument("restore: entropy must be %d..%d bytes in the body, got %d",
			protocol.MinEntropyBytes, protocol.MaxEntropyBytes, len(entropy))
	}
	timeNs, err := strconv.ParseInt(args.TimeNs, 10, 64)
	if err != nil {
		return nil, nil, invalidArgument("restore: time_ns %s is out of range", args.TimeNs)
	}
	if !c.silent && a.server != nil {
		a.server.detachAll(c)
	}
	// Entropy first: whatever runs after this sees the new CRNG.
	if err := a.fixups.AddEntropy(entropy); err != nil {
		return nil, nil, newError("internal", "restore: %s", err.Error())
	}
	if err := a.fixups.SetRealtimeClock(timeNs); err != nil {
		return nil, nil, newError("internal", "restore: %s", err.Error())
	}
	if err := a.fixups.SetHostname(args.Hostname); err != nil {
		return nil, nil, newError("internal", "restore: %s", err.Error())
	}
	if err := a.fixups.FlushNeighbours(); err != nil {
		a.server.log.Warn("restore: cannot flush the neighbour cache", Fields{"error": err.Error()})
	}
	if !c.silent {
		a.mu.Lock()
		id, host := args.SandboxID, args.Hostname
		a.sandboxID, a.hostname = &id, &host
		a.mu.Unlock()
		if a.python != nil {
			a.python.MarkRestored()
		}
	}
	return &protocol.RestoreResult{
		Applied: a.fixups.Kind(), EntropyBytes: int64(len(entropy)), Hostname: args.Hostname, SandboxID: args.SandboxID,
		DurationMs: float64(time.Since(started).Microseconds()) / 1000,
	}, nil, nil
}

func decodeCode(body []byte, op string) (string, error) {
	if !utf8.Valid(body) {
		return "", invalidArgument("%s: the code in the request body is not valid UTF-8", op)
	}
	return string(body), nil
}

func (a *Agent) requirePython(op string) error {
	if a.python == nil {
		return invalidArgument("%s: template %s has no interpreter (interpreter: \"none\")", op, a.template.Name)
	}
	return nil
}

func (a *Agent) Warmup(c *Call, args *protocol.WarmupArgs, body []byte) (*protocol.WarmupResult, []byte, error) {
	code, err := decodeCode(body, "warmup")
	if err != nil {
		return nil, nil, err
	}
	if a.python == nil {
		if trimmed := trimSpace(code); trimmed != "" {
			return nil, nil, a.requirePython("warmup")
		}
		return &protocol.WarmupResult{Warm: a.warmState()}, nil, nil
	}
	r, err := a.python.Warmup(c, code, args.TimeoutMs)
	if err != nil {
		return nil, nil, err
	}
	return &protocol.WarmupResult{
		Result: r.Result, ResultTruncated: r.ResultTruncated, Formats: r.Formats, Stdout: r.Stdout, Stderr: r.Stderr,
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, Error: r.Error, TimedOut: r.TimedOut,
		DurationMs: r.DurationMs, ExecutionCount: r.ExecutionCount, Warm: a.warmState(),
	}, nil, nil
}

func trimSpace(s string) string {
	start, end := 0, len(s)
	for start < end && (s[start] == ' ' || s[start] == '\n' || s[start] == '\t' || s[start] == '\r') {
		start++
	}
	for end > start && (s[end-1] == ' ' || s[end-1] == '\n' || s[end-1] == '\t' || s[end-1] == '\r') {
		end--
	}
	return s[start:end]
}

func (a *Agent) Eval(c *Call, args *protocol.EvalArgs, body []byte) (*protocol.EvalResult, []byte, error) {
	if err := a.requirePython("eval"); err != nil {
		return nil, nil, err
	}
	code, err := decodeCode(body, "eval")
	if err != nil {
		return nil, nil, err
	}
	if args.Cwd != nil {
		if st, err := os.Stat(*args.Cwd); err != nil || !st.IsDir() {
			return nil, nil, notFound("eval: working directory %s does not exist", *args.Cwd)
		}
	}
	r, err := a.python.Cell(c, code, args, args.TimeoutMs, false)
	return r, nil, err
}

func (a *Agent) ContextCreate(c *Call, args *protocol.ContextCreateArgs, body []byte) (*protocol.ContextInfo, []byte, error) {
	if err := a.requirePython("context.create"); err != nil {
		return nil, nil, err
	}
	fields := map[string]any{}
	if args.ID != nil {
		fields["context"] = *args.ID
	}
	if args.Cwd != nil {
		if st, err := os.Stat(*args.Cwd); err != nil || !st.IsDir() {
			return nil, nil, notFound("context.create: working directory %s does not exist", *args.Cwd)
		}
		fields["cwd"] = *args.Cwd
	}
	if args.Language != nil {
		fields["language"] = *args.Language
	}
	reply, err := a.python.ContextOp(c, "context.create", fields)
	if err != nil {
		return nil, nil, err
	}
	return reply.Context, nil, nil
}

func (a *Agent) ContextList(c *Call, args *protocol.ContextListArgs, body []byte) (*protocol.ContextListResult, []byte, error) {
	if err := a.requirePython("context.list"); err != nil {
		return nil, nil, err
	}
	reply, err := a.python.ContextOp(c, "context.list", map[string]any{})
	if err != nil {
		return nil, nil, err
	}
	contexts := reply.Contexts
	if contexts == nil {
		contexts = []protocol.ContextInfo{}
	}
	return &protocol.ContextListResult{Contexts: contexts}, nil, nil
}

func (a *Agent) ContextRestart(c *Call, args *protocol.ContextRefArgs, body []byte) (*protocol.ContextInfo, []byte, error) {
	if err := a.requirePython("context.restart"); err != nil {
		return nil, nil, err
	}
	reply, err := a.python.ContextOp(c, "context.restart", map[string]any{"context": args.ID})
	if err != nil {
		return nil, nil, err
	}
	return reply.Context, nil, nil
}

func (a *Agent) ContextRemove(c *Call, args *protocol.ContextRefArgs, body []byte) (*protocol.EmptyResult, []byte, error) {
	if err := a.requirePython("context.remove"); err != nil {
		return nil, nil, err
	}
	if _, err := a.python.ContextOp(c, "context.remove", map[string]any{"context": args.ID}); err != nil {
		return nil, nil, err
	}
	return &protocol.EmptyResult{}, nil, nil
}
