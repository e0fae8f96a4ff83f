package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"forkd/src/agent/guest/protocol"
)

// Server is the dispatcher: it decodes frames, validates them against the generated schemas, runs each
// request as a call multiplexed by id, and answers. A malformed frame gets an error answer when it carries a
// usable id and is otherwise logged and dropped; nothing the host sends stops the agent.
type Server struct {
	agent   *Agent
	log     *Log
	tr      *Transport
	decoder protocol.Decoder
	mu      sync.Mutex
	calls   map[int64]*Call
	onEnd   func()
}

// Call is one request in flight. `done` closes when the host cancels it; `detached` when nobody will ever
// receive its answer (host gone, a restore started a new host epoch, shutdown): then nothing more is sent.
type Call struct {
	srv        *Server
	ID         int64
	Op         string
	spec       *protocol.OpSpec
	silent     bool
	closed     bool
	cancelled  chan struct{}
	detached   chan struct{}
	done       chan struct{}
	doneOnce   sync.Once
	cancelOnce sync.Once
	detachOnce sync.Once
	inputMu    sync.Mutex
	input      []inputChunk
	inputBytes int
	inputReady chan struct{}
}

type inputChunk struct {
	data []byte
	eof  bool
}

func newServer(agent *Agent, log *Log, tr *Transport, onEnd func()) *Server {
	s := &Server{agent: agent, log: log, tr: tr, calls: map[int64]*Call{}, onEnd: onEnd}
	s.decoder.OnFrame = s.onFrame
	s.decoder.OnError = func(err *protocol.FrameError) {
		log.Warn("skipping undecodable input", Fields{"reason": err.Reason, "error": err.Message})
	}
	return s
}

// Start serves and announces the agent.
func (s *Server) Start() {
	s.tr.Start(TransportEvents{
		Data: s.decoder.Push,
		Disconnect: func() {
			s.log.Info("host disconnected; waiting for the next one", Fields{"detached_calls": s.inFlight()})
			s.decoder.Reset()
			// Nobody is left to receive these calls' answers, and a new host may reuse their ids.
			s.detachAll(nil)
			s.sendHello()
		},
		End: func() {
			s.detachAll(nil)
			s.onEnd()
		},
	})
	s.sendHello()
}

func (s *Server) inFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

func (s *Server) sendHello() {
	s.send(s.agent.hello(), nil, false)
}

// detachAll detaches every call but `keep`: their processes are killed (exec) or left running (proc.*),
// and their answers are never sent.
func (s *Server) detachAll(keep *Call) {
	s.mu.Lock()
	var calls []*Call
	for id, c := range s.calls {
		if c == keep {
			continue
		}
		c.closed = true
		delete(s.calls, id)
		calls = append(calls, c)
	}
	s.mu.Unlock()
	for _, c := range calls {
		c.detach()
	}
}

func (s *Server) onFrame(frame protocol.Frame) {
	message, err := protocol.ParseHostMessage(frame.Header)
	if err != nil {
		id, usable := usableRequestID(frame)
		s.mu.Lock()
		_, running := s.calls[id]
		s.mu.Unlock()
		if usable && !running {
			s.sendError(id, describeHeaderError(frame.Kind, err), false)
		} else {
			kind := frame.Kind
			if len(kind) > 16 {
				kind = kind[:16]
			}
			s.log.Warn("dropped an invalid frame", Fields{"t": kind, "error": err.Error()})
		}
		return
	}
	switch m := message.(type) {
	case *protocol.RequestHeader:
		s.startCall(m, frame.Body)
	case *protocol.InputHeader:
		s.deliverInput(m, frame.Body)
	case *protocol.CancelHeader:
		s.mu.Lock()
		c := s.calls[m.ID]
		s.mu.Unlock()
		if c != nil {
			c.cancel()
		}
	}
}

func describeHeaderError(kind string, err error) error {
	var unknown *protocol.UnknownKindError
	if errors.As(err, &unknown) {
		return invalidArgument("%s", err.Error())
	}
	return invalidArgument("invalid %s header: %s", kind, err.Error())
}

func usableRequestID(frame protocol.Frame) (int64, bool) {
	if frame.Kind != "req" {
		return 0, false
	}
	raw, ok := frame.Header["id"]
	if !ok {
		return 0, false
	}
	var id float64
	if json.Unmarshal(raw, &id) != nil || id != float64(int64(id)) || id < 1 || id > protocol.MaxID {
		return 0, false
	}
	return int64(id), true
}

// inlineOps answer at once without blocking, so they run on the reader goroutine (no goroutine per call).
var inlineOps = map[string]bool{"ping": true, "restore": true, "proc.list": true, "proc.signal": true, "proc.resize": true}

func (s *Server) startCall(req *protocol.RequestHeader, body []byte) {
	s.mu.Lock()
	if _, running := s.calls[req.ID]; running {
		s.mu.Unlock()
		s.log.Warn("dropped a request reusing the id of a running call", Fields{"id": req.ID, "op": req.Op})
		return
	}
	if len(s.calls) >= protocol.MaxInFlight {
		s.mu.Unlock()
		s.sendError(req.ID, newError(protocol.CodeTooManyRequests, "the agent already runs %d calls", protocol.MaxInFlight), false)
		return
	}
	spec := protocol.Ops[req.Op]
	if spec == nil {
		s.mu.Unlock()
		s.sendError(req.ID, newError(protocol.CodeNotImplemented, "%s", (&protocol.UnknownOpError{Op: req.Op}).Error()), false)
		return
	}
	args, err := decodeArgs(spec, req.Args, body)
	if err != nil {
		s.mu.Unlock()
		s.sendError(req.ID, err, false)
		return
	}
	c := s.newCall(req.ID, spec, false)
	s.calls[req.ID] = c
	s.mu.Unlock()
	if inlineOps[req.Op] {
		s.run(c, args, body)
	} else {
		go s.run(c, args, body)
	}
}

func decodeArgs(spec *protocol.OpSpec, raw json.RawMessage, body []byte) (any, error) {
	args, err := spec.DecodeArgs(raw)
	if err != nil {
		return nil, invalidArgument("invalid %s arguments: %s", spec.Name, err.Error())
	}
	if spec.RequestBody == "none" && len(body) > 0 {
		return nil, invalidArgument("%s takes no request body (got %d bytes)", spec.Name, len(body))
	}
	return args, nil
}

func (s *Server) newCall(id int64, spec *protocol.OpSpec, silent bool) *Call {
	return &Call{
		srv: s, ID: id, Op: spec.Name, spec: spec, silent: silent,
		cancelled: make(chan struct{}), detached: make(chan struct{}), done: make(chan struct{}),
		inputReady: make(chan struct{}, 1),
	}
}

func (s *Server) run(c *Call, args any, body []byte) {
	result, out, err := protocol.Dispatch[*Call](s.agent, c, c.Op, args, body)
	if err != nil {
		c.fail(err)
		return
	}
	c.answer(result, out)
}

// prime runs one request through decode, validation, handler and encoding without sending anything, so a
// snapshot's children do not each pay for first use of these paths.
func (s *Server) prime(op string, args string, body []byte) error {
	spec := protocol.Ops[op]
	if spec == nil {
		return fmt.Errorf("priming: no op %s", op)
	}
	decoded, err := decodeArgs(spec, json.RawMessage(args), body)
	if err != nil {
		return err
	}
	c := s.newCall(protocol.MaxID, spec, true)
	result, out, err := protocol.Dispatch[*Call](s.agent, c, op, decoded, body)
	if err != nil {
		return err
	}
	c.answer(result, out)
	return nil
}

func (s *Server) deliverInput(m *protocol.InputHeader, body []byte) {
	s.mu.Lock()
	c := s.calls[m.ID]
	s.mu.Unlock()
	if c == nil {
		return // the call may have just finished; its stdin no longer matters
	}
	if !c.spec.Input {
		s.log.Warn("dropped input for a call that takes none", Fields{"id": c.ID, "op": c.Op})
		return
	}
	c.inputMu.Lock()
	c.input = append(c.input, inputChunk{data: body, eof: m.Eof != nil && *m.Eof})
	c.inputBytes += len(body)
	over := c.inputBytes > 2*protocol.StdinWindowBytes
	c.inputMu.Unlock()
	if over {
		// The host ignored its send window: refuse rather than buffer without bound.
		s.log.Warn("stdin beyond the send window; cancelling the call", Fields{"id": c.ID})
		c.cancel()
	}
	select {
	case c.inputReady <- struct{}{}:
	default:
	}
}

// ---- what handlers see of their call

// Done closes when the call was cancelled or detached.
func (c *Call) Done() <-chan struct{} { return c.done }

// Detached reports whether nobody will receive the answer.
func (c *Call) Detached() <-chan struct{} { return c.detached }

// Cancelled is closed when the host cancelled the call.
func (c *Call) Cancelled() <-chan struct{} { return c.cancelled }

func (c *Call) cancel() {
	c.cancelOnce.Do(func() { close(c.cancelled) })
	c.doneOnce.Do(func() { close(c.done) })
}

func (c *Call) detach() {
	c.detachOnce.Do(func() { close(c.detached) })
	c.doneOnce.Do(func() { close(c.done) })
}

// cancelError is the answer of a call the host cancelled.
func (c *Call) cancelError() error {
	return newError(protocol.CodeUnavailable, "call %d was cancelled by the host", c.ID)
}

// NextInput waits for stdin sent with `in` frames (nil, false once the call is done).
func (c *Call) NextInput() (inputChunk, bool) {
	for {
		c.inputMu.Lock()
		if len(c.input) > 0 {
			chunk := c.input[0]
			c.input = c.input[1:]
			c.inputBytes -= len(chunk.data)
			c.inputMu.Unlock()
			return chunk, true
		}
		c.inputMu.Unlock()
		select {
		case <-c.inputReady:
		case <-c.done:
			return inputChunk{}, false
		}
	}
}

// Emit sends an output event (dropped once the call is answered or detached).
func (c *Call) Emit(ev string, body []byte) {
	c.event(protocol.EventHeader{T: "evt", ID: c.ID, Ev: ev}, body)
}

func (c *Call) event(header protocol.EventHeader, body []byte) {
	c.srv.mu.Lock()
	closed := c.closed
	c.srv.mu.Unlock()
	if closed {
		return
	}
	select {
	case <-c.detached:
		return
	default:
	}
	c.srv.send(&header, body, c.silent)
}

// AckInput tells the host that `n` stdin bytes were consumed.
func (c *Call) AckInput(n int) {
	b := int64(n)
	c.event(protocol.EventHeader{T: "evt", ID: c.ID, Ev: "stdin_ack", Bytes: &b}, nil)
}

// WaitForRoom blocks while the transport is congested (false if the call ended meanwhile).
func (c *Call) WaitForRoom() bool {
	for c.srv.tr != nil && c.srv.tr.Congested() {
		select {
		case <-c.srv.tr.Drained():
		case <-c.done:
			return false
		}
	}
	return true
}

// finish closes the call; false when it was already closed (detached or answered).
func (c *Call) finish() bool {
	if c.silent {
		return true
	}
	s := c.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.closed {
		return false
	}
	c.closed = true
	if s.calls[c.ID] == c {
		delete(s.calls, c.ID)
	}
	return true
}

func (c *Call) answer(result any, body []byte) {
	if !c.finish() {
		return
	}
	s := c.srv
	if c.spec.ResponseBody == "bytes" {
		raw, err := marshal(result)
		if err != nil {
			s.sendError(c.ID, err, c.silent)
			return
		}
		s.send(&protocol.ResultHeader{T: "res", ID: c.ID, Ok: true, Result: raw}, body, c.silent)
		return
	}
	raw, err := marshal(result)
	if err != nil {
		s.sendError(c.ID, err, c.silent)
		return
	}
	if len(raw) > protocol.ResultInBodyThreshold {
		inBody := true
		s.send(&protocol.ResultHeader{T: "res", ID: c.ID, Ok: true, ResultInBody: &inBody}, raw, c.silent)
		return
	}
	s.send(&protocol.ResultHeader{T: "res", ID: c.ID, Ok: true, Result: raw}, nil, c.silent)
}

func (c *Call) fail(err error) {
	if !c.finish() {
		return
	}
	c.srv.sendError(c.ID, err, c.silent)
}

func (s *Server) sendError(id int64, err error, silent bool) {
	s.send(&protocol.ErrorHeader{T: "res", ID: id, Ok: false, Error: wireError(err)}, nil, silent)
}

// marshal encodes JSON without HTML escaping (smaller, and the host parses plain JSON).
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return b[:len(b)-1], nil
}

// send encodes always (priming exercises the encoder too) and queues the frame unless silent.
func (s *Server) send(header any, body []byte, silent bool) {
	raw, err := marshal(header)
	var frame []byte
	if err == nil {
		frame, err = protocol.EncodeFrame(raw, body)
	}
	if err != nil {
		s.log.Error("cannot encode a frame", Fields{"error": err.Error()})
		if res, ok := header.(*protocol.ResultHeader); ok && !silent {
			s.sendError(res.ID, newError(protocol.CodePayloadTooLarge, "%s", err.Error()), false)
		}
		return
	}
	if !silent && s.tr != nil {
		s.tr.Send(frame)
	}
}
