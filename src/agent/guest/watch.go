package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"forkd/src/agent/guest/protocol"
)

// Watch streams inotify events under a directory as `fs` events (names relative to the watched path) until
// the host cancels the call or the directory goes away, then answers with a summary. Recursive watches add a
// watch for every subdirectory, including ones that appear later. Events wait in a bounded queue while the
// host is behind; beyond MaxQueuedWatchEvents they are counted as dropped.
func (a *Agent) Watch(c *Call, args *protocol.WatchArgs, body []byte) (*protocol.WatchResult, []byte, error) {
	root := filepath.Clean(args.Path)
	st, err := os.Stat(root)
	if err != nil {
		return nil, nil, fsError(unwrapPath(err), "watch", args.Path)
	}
	if !st.IsDir() {
		return nil, nil, invalidArgument("watch %s: not a directory", args.Path)
	}
	recursive := args.Recursive != nil && *args.Recursive
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil, nil, fsError(err, "watch", args.Path)
	}
	file := os.NewFile(uintptr(fd), "inotify") // nonblocking: read through Go's poller, woken by Close
	w := &watcher{fd: fd, root: root, recursive: recursive, dirs: map[int32]string{}}
	if err := w.add(root); err != nil {
		file.Close()
		return nil, nil, fsError(err, "watch", args.Path)
	}
	if recursive {
		w.addTree(root, nil)
	}

	q := &eventQueue{ready: make(chan struct{}, 1)}
	ended := make(chan string, 1)
	go func() {
		ended <- w.read(file, q)
	}()
	var sent int64
	reason := ""
	for reason == "" {
		for _, ev := range q.take() {
			ev := ev
			c.event(protocol.EventHeader{T: "evt", ID: c.ID, Ev: "fs", Fs: &ev}, nil)
			sent++
		}
		if !c.WaitForRoom() {
			reason = "cancelled"
			break
		}
		select {
		case <-q.ready:
		case <-c.Done():
			reason = "cancelled"
		case r := <-ended:
			for _, ev := range q.take() {
				ev := ev
				c.event(protocol.EventHeader{T: "evt", ID: c.ID, Ev: "fs", Fs: &ev}, nil)
				sent++
			}
			reason = r
		}
	}
	file.Close()
	return &protocol.WatchResult{Events: sent, Dropped: q.droppedCount(), Reason: reason}, nil, nil
}

type eventQueue struct {
	mu      sync.Mutex
	events  []protocol.FsEvent
	dropped int64
	ready   chan struct{}
}

func (q *eventQueue) push(ev protocol.FsEvent) {
	q.mu.Lock()
	if len(q.events) >= protocol.MaxQueuedWatchEvents {
		q.dropped++
	} else {
		q.events = append(q.events, ev)
	}
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *eventQueue) take() []protocol.FsEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.events
	q.events = nil
	return out
}

func (q *eventQueue) droppedCount() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dropped
}

type watcher struct {
	fd        int
	root      string
	recursive bool
	mu        sync.Mutex
	dirs      map[int32]string
	rootWd    int32
}

const watchMask = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_DELETE | syscall.IN_MOVED_FROM |
	syscall.IN_MOVED_TO | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF | syscall.IN_ONLYDIR

func (w *watcher) add(dir string) error {
	wd, err := syscall.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.dirs[int32(wd)] = dir
	if dir == w.root {
		w.rootWd = int32(wd)
	}
	w.mu.Unlock()
	return nil
}

// addTree watches every directory under dir; with q, entries found are reported as created (they appeared
// between the directory's creation and its watch).
func (w *watcher) addTree(dir string, q *eventQueue) {
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == dir {
			return nil
		}
		if q != nil {
			q.push(protocol.FsEvent{Name: w.relative(path), Op: "create"})
		}
		if d.IsDir() {
			_ = w.add(path)
		}
		return nil
	})
}

func (w *watcher) relative(path string) string {
	rel, err := filepath.Rel(w.root, path)
	if err != nil {
		return path
	}
	return rel
}

// read turns inotify records into events until the root goes away ("removed") or the file is closed.
func (w *watcher) read(file *os.File, q *eventQueue) string {
	buf := make([]byte, 64<<10)
	for {
		n, err := file.Read(buf)
		if err != nil {
			return "cancelled"
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			raw := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+syscall.SizeofInotifyEvent : off+syscall.SizeofInotifyEvent+int(raw.Len)]
			off += syscall.SizeofInotifyEvent + int(raw.Len)
			name := strings.TrimRight(string(nameBytes), "\x00")
			w.mu.Lock()
			dir, known := w.dirs[raw.Wd]
			isRoot := raw.Wd == w.rootWd
			w.mu.Unlock()
			if raw.Mask&syscall.IN_Q_OVERFLOW != 0 {
				q.mu.Lock()
				q.dropped++
				q.mu.Unlock()
				continue
			}
			if !known {
				continue
			}
			if raw.Mask&(syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF|syscall.IN_IGNORED) != 0 {
				if isRoot {
					return "removed"
				}
				w.mu.Lock()
				if raw.Mask&syscall.IN_IGNORED != 0 {
					delete(w.dirs, raw.Wd)
				}
				w.mu.Unlock()
				continue
			}
			full := filepath.Join(dir, name)
			op := ""
			switch {
			case raw.Mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
				op = "create"
			case raw.Mask&syscall.IN_MODIFY != 0:
				op = "write"
			case raw.Mask&syscall.IN_DELETE != 0:
				op = "remove"
			case raw.Mask&syscall.IN_MOVED_FROM != 0:
				op = "rename"
			case raw.Mask&syscall.IN_ATTRIB != 0:
				op = "chmod"
			}
			if op == "" {
				continue
			}
			rel := w.relative(full)
			if len(rel) > 4096 {
				rel = rel[:4096]
			}
			q.push(protocol.FsEvent{Name: rel, Op: op})
			if w.recursive && op == "create" && raw.Mask&syscall.IN_ISDIR != 0 {
				if w.add(full) == nil {
					w.addTree(full, q)
				}
			}
		}
	}
}
