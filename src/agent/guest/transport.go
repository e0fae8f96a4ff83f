package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"forkd/src/agent/guest/protocol"
)

// TransportEvents are what a transport reports to the server, all from its reader goroutine.
type TransportEvents struct {
	Data func([]byte)
	// Disconnect: the host went away; partial input is meaningless and unsent output was dropped.
	Disconnect func()
	// End: input ended for good (stdin EOF); the agent shuts down.
	End func()
}

// highWaterBytes: output producers (exec, proc.*, watch, streamed eval) pause while more than this is
// queued for the host.
const highWaterBytes = protocol.MaxQueuedOutputBytes

// Transport is the byte stream the agent speaks the protocol on: one reader goroutine, one writer goroutine
// with a FIFO of whole frames.
type Transport struct {
	log      *Log
	in       io.Reader
	out      io.Writer
	isPort   bool
	mu       sync.Mutex
	cond     *sync.Cond
	queue    [][]byte
	queued   int
	drained  chan struct{}
	hostSeen bool
	events   TransportEvents
}

func newTransport(log *Log, in io.Reader, out io.Writer, isPort bool) *Transport {
	t := &Transport{log: log, in: in, out: out, isPort: isPort, drained: make(chan struct{})}
	t.cond = sync.NewCond(&t.mu)
	close(t.drained)
	return t
}

const portName = "org.forkd.agent"
const virtioPortsDir = "/sys/class/virtio-ports"

// findPortDevice finds /dev/<vportNpM> whose sysfs name is `name`.
func findPortDevice(name string) string {
	entries, err := os.ReadDir(virtioPortsDir)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(virtioPortsDir, e.Name(), "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/" + e.Name()
		}
	}
	return ""
}

// openPort waits for the port to appear (the device shows up asynchronously at boot), with a backoff.
func openPort(log *Log, name string) *Transport {
	delay := 5 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if dev := findPortDevice(name); dev != "" {
			// A raw blocking descriptor: a read blocks in the kernel while a host is connected and idle.
			fd, err := syscall.Open(dev, syscall.O_RDWR|syscall.O_CLOEXEC|syscall.O_NOCTTY, 0)
			if err == nil {
				log.Info("serving on virtio-serial port", Fields{"device": dev, "name": name})
				return newTransport(log, rawFd(fd), rawFd(fd), true)
			}
			log.Warn("cannot open the virtio-serial port", Fields{"device": dev, "error": err.Error()})
		} else if attempt%20 == 0 {
			log.Warn("virtio-serial port not found yet", Fields{"name": name})
		}
		time.Sleep(delay)
		if delay < 500*time.Millisecond {
			delay *= 2
		}
	}
}

// Start runs the reader and writer goroutines.
func (t *Transport) Start(events TransportEvents) {
	t.events = events
	go t.readLoop()
	go t.writeLoop()
}

// rawFd is the port's blocking descriptor: read() returns 0 while no host is connected (not an EOF for good),
// which os.File would report as io.EOF.
type rawFd int

func (fd rawFd) Read(b []byte) (int, error) {
	for {
		n, err := syscall.Read(int(fd), b)
		if err != syscall.EINTR {
			return n, err
		}
	}
}

func (fd rawFd) Write(b []byte) (int, error) {
	for {
		n, err := syscall.Write(int(fd), b)
		if err != syscall.EINTR {
			return n, err
		}
	}
}

func (t *Transport) readLoop() {
	buf := make([]byte, 64<<10)
	// Polling while no host is connected: fast at first (a restored child reconnects within ms), then cheap.
	idle := 5 * time.Millisecond
	for {
		n, err := t.in.Read(buf)
		if err != nil || (n == 0 && !t.isPort) {
			if !t.isPort {
				if n > 0 {
					t.events.Data(buf[:n])
				}
				t.events.End()
				return
			}
			t.log.Warn("agent port read failed", Fields{"error": err.Error()})
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if n == 0 {
			// The port reads 0 while no host is connected: the host may come back.
			t.mu.Lock()
			seen := t.hostSeen
			t.mu.Unlock()
			if seen {
				t.hostGone()
			}
			time.Sleep(idle)
			if idle < 200*time.Millisecond {
				idle *= 2
			}
			continue
		}
		idle = 5 * time.Millisecond
		t.mu.Lock()
		t.hostSeen = true
		t.mu.Unlock()
		t.events.Data(buf[:n])
	}
}

// hostGone drops output meant for the old host. A write already inside the kernel may still reach the next
// host as a cut frame, which its decoder skips by resynchronising on the magic.
func (t *Transport) hostGone() {
	t.mu.Lock()
	t.hostSeen = false
	t.queue = nil
	t.queued = 0
	t.signalDrainedLocked()
	t.mu.Unlock()
	t.events.Disconnect()
}

// Send queues one whole frame.
func (t *Transport) Send(frame []byte) {
	t.mu.Lock()
	if t.queued == 0 {
		t.drained = make(chan struct{})
	}
	t.queue = append(t.queue, frame)
	t.queued += len(frame)
	t.mu.Unlock()
	t.cond.Signal()
}

// Congested: producers should wait for Drained before producing more.
func (t *Transport) Congested() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.queued > highWaterBytes
}

// Drained is closed once nothing is queued.
func (t *Transport) Drained() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.drained
}

func (t *Transport) signalDrainedLocked() {
	select {
	case <-t.drained:
	default:
		close(t.drained)
	}
}

func (t *Transport) writeLoop() {
	for {
		t.mu.Lock()
		for len(t.queue) == 0 {
			t.cond.Wait()
		}
		head := t.queue[0]
		t.mu.Unlock()
		// A write to the port blocks until a host is connected and takes at most 32 KiB per call.
		n, err := t.out.Write(head)
		t.mu.Lock()
		if len(t.queue) == 0 || !bytesSame(t.queue[0], head) {
			// The host changed while this write was blocked: the queue was dropped.
			t.mu.Unlock()
			continue
		}
		if err != nil {
			t.mu.Unlock()
			if !t.isPort {
				t.events.End()
				return
			}
			t.log.Warn("agent port write failed", Fields{"error": err.Error()})
			time.Sleep(200 * time.Millisecond)
			continue
		}
		t.hostSeen = true
		t.queued -= n
		if n >= len(head) {
			t.queue[0] = nil
			t.queue = t.queue[1:]
		} else {
			t.queue[0] = head[n:]
		}
		if t.queued == 0 {
			t.queue = nil
			t.signalDrainedLocked()
		}
		t.mu.Unlock()
	}
}

// bytesSame: the same slice (not just equal bytes): the queue head is still the frame being written.
func bytesSame(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
