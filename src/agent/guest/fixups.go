package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// Fixups is what a restored child changes before anything else: every child of one snapshot wakes up with
// the parent's wall clock, kernel RNG state, hostname and neighbour cache. Host tests run the agent as root
// on the host, so they use the dry-run kind, which records instead of acting.
type Fixups interface {
	Kind() string
	SetRealtimeClock(ns int64) error
	AddEntropy(entropy []byte) error
	SetHostname(name string) error
	// FlushNeighbours forgets the parent's ARP/NDP entries (only when the guest has a network interface).
	FlushNeighbours() error
	// StopPit stops the i8254 PIT's periodic interrupt, once, before the snapshot.
	StopPit() error
}

type dryRunFixups struct{}

func (dryRunFixups) Kind() string                 { return "dry-run" }
func (dryRunFixups) SetRealtimeClock(int64) error { return nil }
func (dryRunFixups) AddEntropy([]byte) error      { return nil }
func (dryRunFixups) SetHostname(string) error     { return nil }
func (dryRunFixups) FlushNeighbours() error       { return nil }
func (dryRunFixups) StopPit() error               { return nil }

const (
	rndAddEntropy = 0x40085203 // _IOW('R', 0x03, int[2])
	rndReseedCrng = 0x5207     // _IO('R', 0x07)
	rndGetEntCnt  = 0x80045200 // _IOR('R', 0x00, int)
)

// systemFixups keeps /dev/urandom open from the start: a syscall a restored child does not make is guest
// code TCG does not translate afresh in that child.
type systemFixups struct {
	random *os.File
}

func newSystemFixups() (*systemFixups, error) {
	f, err := os.Open("/dev/urandom")
	if err != nil {
		return nil, err
	}
	return &systemFixups{random: f}, nil
}

func (*systemFixups) Kind() string { return "system" }

func (*systemFixups) SetRealtimeClock(ns int64) error {
	ts := syscall.NsecToTimespec(ns)
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_SETTIME, 0, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return fmt.Errorf("clock_settime failed: %w", e)
	}
	return nil
}

func ioctl(fd uintptr, req uintptr, arg uintptr) syscall.Errno {
	_, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, req, arg)
	return e
}

// AddEntropy: struct rand_pool_info { int entropy_count (bits); int buf_size (bytes); __u32 buf[]; },
// credited, then the CRNG is forced to reseed from it.
func (f *systemFixups) AddEntropy(entropy []byte) error {
	info := make([]byte, 8+len(entropy))
	binary.LittleEndian.PutUint32(info[0:], uint32(len(entropy)*8))
	binary.LittleEndian.PutUint32(info[4:], uint32(len(entropy)))
	copy(info[8:], entropy)
	if e := ioctl(f.random.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&info[0]))); e != 0 {
		return fmt.Errorf("ioctl RNDADDENTROPY failed: %w", e)
	}
	if e := ioctl(f.random.Fd(), rndReseedCrng, 0); e != 0 {
		return fmt.Errorf("ioctl RNDRESEEDCRNG failed: %w", e)
	}
	return nil
}

func (*systemFixups) SetHostname(name string) error {
	if err := syscall.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("sethostname failed: %w", err)
	}
	return nil
}

func (*systemFixups) FlushNeighbours() error { return flushNeighbours() }

// StopPit: QEMU's emulated i8254 keeps interrupting on channel 0 after boot although the kernel keeps time
// with the LAPIC timer and the TSC; under TCG each interrupt costs host CPU in every idle child. Programming
// channel 0 as a one-shot (mode 0) with count 0 lets it expire once, after which QEMU stops its timer, and
// every child restored from the snapshot inherits the stopped PIT. (`-machine pit=off` instead breaks the
// kernel's early TSC calibration.)
func (*systemFixups) StopPit() error {
	f, err := os.OpenFile("/dev/port", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const pitCommand, pitChannel0 = 0x43, 0x40
	for _, w := range []struct {
		port  int64
		value byte
	}{{pitCommand, 0x30}, {pitChannel0, 0x00}, {pitChannel0, 0x00}} {
		if _, err := f.WriteAt([]byte{w.value}, w.port); err != nil {
			return err
		}
	}
	return nil
}

// unavailableFixups: the system fix-ups could not be set up; every restore reports why.
type unavailableFixups struct{ reason string }

func (unavailableFixups) Kind() string { return "system" }
func (u unavailableFixups) err() error {
	return newError("internal", "restore fix-ups are unavailable: %s", u.reason)
}
func (u unavailableFixups) SetRealtimeClock(int64) error { return u.err() }
func (u unavailableFixups) AddEntropy([]byte) error      { return u.err() }
func (u unavailableFixups) SetHostname(string) error     { return u.err() }
func (unavailableFixups) FlushNeighbours() error         { return nil }
func (unavailableFixups) StopPit() error                 { return (&systemFixups{}).StopPit() }

// SelfTestReport proves the system calls work in this root without changing anything.
type SelfTestReport struct {
	Agent                 string `json:"agent"`
	Go                    string `json:"go"`
	RealtimeNs            string `json:"realtimeNs"`
	EntropyCount          int32  `json:"entropyCount"`
	SettimeProbeErrno     int    `json:"settimeProbeErrno"`
	AddEntropyProbeErrno  int    `json:"addEntropyProbeErrno"`
	SethostnameProbeErrno int    `json:"sethostnameProbeErrno"`
	CloseOnExec           []int  `json:"closeOnExec"`
	Pid                   int    `json:"pid"`
}

// selfTest reads the clock and the entropy count, and calls clock_settime, RNDADDENTROPY and sethostname
// with arguments the kernel rejects before acting (all EINVAL), through the same calls the fix-ups use.
func selfTest() (*SelfTestReport, error) {
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 0, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return nil, fmt.Errorf("clock_gettime: %w", e)
	}
	report := &SelfTestReport{RealtimeNs: fmt.Sprint(ts.Nano())}
	monotonic := syscall.Timespec{Sec: 1}
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_SETTIME, 1, uintptr(unsafe.Pointer(&monotonic)), 0); e != 0 {
		report.SettimeProbeErrno = int(e)
	}
	f, err := os.Open("/dev/urandom")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var count int32
	if e := ioctl(f.Fd(), rndGetEntCnt, uintptr(unsafe.Pointer(&count))); e != 0 {
		return nil, fmt.Errorf("ioctl RNDGETENTCNT: %w", e)
	}
	report.EntropyCount = count
	invalid := make([]byte, 8+32)
	binary.LittleEndian.PutUint32(invalid[0:], 0xffffffff) // entropy_count -1
	binary.LittleEndian.PutUint32(invalid[4:], 32)
	if e := ioctl(f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&invalid[0]))); e != 0 {
		report.AddEntropyProbeErrno = int(e)
	}
	tooLong := make([]byte, 65)
	for i := range tooLong {
		tooLong[i] = 'a'
	}
	if err := syscall.Sethostname(tooLong); err != nil {
		if errno, ok := err.(syscall.Errno); ok {
			report.SethostnameProbeErrno = int(errno)
		}
	}
	return report, nil
}
