// forkd-netd: the daemon's long-running network helper. It creates, configures and removes sandbox network
// namespaces over netlink (no ip process per step) and applies their nft rules (one nft process per
// transaction, started inside the namespace), on requests read from stdin and answered on stdout.
//
// Only the daemon that started it can talk to it: the protocol runs over the pipes it was given, it takes no
// other input, and it exits when the daemon does (stdin's end, and PR_SET_PDEATHSIG). Messages are one JSON
// object per line, bounded (--max-message bytes); requests run concurrently (at most --max-concurrent), each
// on an OS thread of its own that is discarded afterwards (it may have entered a sandbox's namespace).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

func main() {
	maxMessage := flag.Int("max-message", 1<<20, "longest request or response line, in bytes")
	maxConcurrent := flag.Int("max-concurrent", 8, "requests run at once")
	parent := flag.Int("parent", 0, "the daemon's pid: exit if it is not (or no longer) our parent")
	flag.Parse()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		fatal(fmt.Errorf("PR_SET_PDEATHSIG: %w", err))
	}
	if *parent <= 0 || os.Getppid() != *parent {
		fatal(fmt.Errorf("started by pid %d, not by the daemon (--parent %d)", os.Getppid(), *parent))
	}
	if err := serve(os.Stdin, os.Stdout, *maxMessage, *maxConcurrent); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "forkd-netd: %v\n", err)
	os.Exit(1)
}

// serve answers requests until stdin ends; a line over the bound or not JSON ends the helper (the daemon
// sent it, so it is a bug there, and the stream cannot be resynchronised safely).
func serve(in io.Reader, out io.Writer, maxMessage, maxConcurrent int) error {
	reader := bufio.NewReaderSize(in, 64*1024)
	var writeMu sync.Mutex
	var running sync.WaitGroup
	slots := make(chan struct{}, maxConcurrent)
	answer := func(resp Response) {
		line, _ := json.Marshal(resp)
		writeMu.Lock()
		defer writeMu.Unlock()
		out.Write(append(line, '\n'))
	}
	defer running.Wait()
	for {
		line, err := readLine(reader, maxMessage)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var req Request
		if err := json.Unmarshal(line, &req); err != nil {
			return fmt.Errorf("request is not JSON: %w", err)
		}
		if err := req.validate(); err != nil {
			answer(Response{ID: req.ID, Error: err.Error()})
			continue
		}
		slots <- struct{}{}
		running.Add(1)
		go func() {
			defer running.Done()
			defer func() { <-slots }()
			answer(run(&req))
		}()
	}
}

// readLine reads one line of at most max bytes (without its newline).
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max+1 {
			return nil, fmt.Errorf("request longer than %d bytes", max)
		}
		if err == nil {
			return line[:len(line)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) && len(line) > 0 {
				return nil, fmt.Errorf("request cut short at the end of input")
			}
			return nil, err
		}
	}
}

var handlers = map[string]func(*Request) error{
	opLink:      link,
	opConfigure: configure,
	opRules:     rules,
	opRemove:    remove,
}

// run executes one request on a locked OS thread that is never unlocked, so Go discards it afterwards
// whatever namespace it was left in.
func run(req *Request) Response {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		done <- handlers[req.Op](req)
	}()
	if err := <-done; err != nil {
		return Response{ID: req.ID, Error: err.Error()}
	}
	return Response{ID: req.ID, OK: true}
}
