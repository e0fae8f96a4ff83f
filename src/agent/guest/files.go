package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"

	"forkd/src/agent/guest/protocol"
)

// The file ops: writes are atomic (a temporary file beside the target, renamed into place) unless appending,
// reads never block on FIFOs, and filesystem errors become catalogue errors naming the op and the path.

var tempCounter int64

// owner of files an op creates: nil = root (the agent's own identity).
func ownerFor(op string, name *string) (*User, error) {
	if name == nil {
		return nil, nil
	}
	return lookupUser(op, *name)
}

func chownTo(path string, u *User) error {
	if u == nil {
		return nil
	}
	return os.Lchown(path, int(u.UID), int(u.GID))
}

// mkdirAll creates dir and its missing parents, chowning each one it created to u.
func mkdirAll(dir string, mode os.FileMode, u *User) (created bool, err error) {
	st, err := os.Stat(dir)
	if err == nil {
		if !st.IsDir() {
			return false, syscall.ENOTDIR
		}
		return false, nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if _, err := mkdirAll(parent, 0o755, u); err != nil {
			return false, err
		}
	}
	if err := os.Mkdir(dir, mode); err != nil {
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, err
	}
	return true, chownTo(dir, u)
}

func (a *Agent) FileWrite(c *Call, args *protocol.FileWriteArgs, body []byte) (*protocol.FileWriteResult, []byte, error) {
	target := args.Path
	name := filepath.Base(target)
	if strings.HasSuffix(target, "/") || name == "." || name == ".." || name == "/" {
		return nil, nil, invalidArgument("file.write %s: needs a file path, not a directory", target)
	}
	if len(body) > protocol.MaxFileBytes {
		return nil, nil, newError(protocol.CodePayloadTooLarge, "file.write %s: %d bytes exceeds %d", target, len(body), protocol.MaxFileBytes)
	}
	u, err := ownerFor("file.write", args.User)
	if err != nil {
		return nil, nil, err
	}
	dir := filepath.Dir(target)
	mode := os.FileMode(0o644)
	if args.Mode != nil {
		mode = os.FileMode(*args.Mode)
	}
	if args.Parents == nil || *args.Parents {
		if _, err := mkdirAll(dir, 0o755, u); err != nil {
			if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EEXIST) {
				return nil, nil, invalidArgument("file.write %s: a parent of it exists and is not a directory", target)
			}
			return nil, nil, fsError(err, "file.write", target)
		}
	}
	if args.Append != nil && *args.Append {
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, mode)
		if err != nil {
			return nil, nil, fsError(unwrapPath(err), "file.write", target)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && !st.Mode().IsRegular() {
			return nil, nil, invalidArgument("file.write %s: not a regular file", target)
		}
		if _, err := f.Write(body); err != nil {
			return nil, nil, fsError(unwrapPath(err), "file.write", target)
		}
		if err := chownTo(target, u); err != nil {
			return nil, nil, fsError(unwrapPath(err), "file.write", target)
		}
		return &protocol.FileWriteResult{Bytes: int64(len(body))}, nil, nil
	}
	short := name
	if len(short) > 200 {
		short = short[:200]
	}
	temp := filepath.Join(dir, fmt.Sprintf(".%s.forkd-%d-%d.tmp", short, os.Getpid(), atomic.AddInt64(&tempCounter, 1)))
	if err := writeTemp(temp, body, mode, u); err != nil {
		_ = os.Remove(temp)
		return nil, nil, fsError(unwrapPath(err), "file.write", target)
	}
	if err := os.Rename(temp, target); err != nil {
		_ = os.Remove(temp)
		return nil, nil, fsError(unwrapPath(err), "file.write", target)
	}
	return &protocol.FileWriteResult{Bytes: int64(len(body))}, nil, nil
}

func writeTemp(temp string, body []byte, mode os.FileMode, u *User) error {
	f, err := os.OpenFile(temp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(body); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	// open()'s mode is filtered by the umask; the caller asked for exactly this one.
	if err := os.Chmod(temp, mode); err != nil {
		return err
	}
	if err := chownTo(temp, u); err != nil {
		return err
	}
	// chown clears set-id bits: set the mode again when the owner changed.
	if u != nil && mode&(os.ModeSetuid|os.ModeSetgid|0o6000) != 0 {
		return os.Chmod(temp, mode)
	}
	return nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

func (a *Agent) FileRead(c *Call, args *protocol.FileReadArgs, body []byte) (*protocol.FileReadResult, []byte, error) {
	// O_NONBLOCK: opening a FIFO must not wait for a writer.
	fd, err := syscall.Open(args.Path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fsError(err, "file.read", args.Path)
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, nil, fsError(err, "file.read", args.Path)
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		return nil, nil, invalidArgument("file.read %s: is a directory", args.Path)
	case syscall.S_IFIFO, syscall.S_IFSOCK:
		return nil, nil, invalidArgument("file.read %s: is a FIFO or socket, not a file", args.Path)
	}
	// One byte more than asked tells whether there is more (sizes of /proc files are 0).
	buf := make([]byte, args.MaxBytes+1)
	filled := 0
	offset := int64(0)
	if args.Offset != nil {
		offset = *args.Offset
	}
	for filled < len(buf) {
		n, err := syscall.Pread(fd, buf[filled:], offset)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.ESPIPE {
			// Character devices without positions: read sequentially from the start.
			n, err = syscall.Read(fd, buf[filled:])
		}
		if err == syscall.EAGAIN {
			break
		}
		if err != nil {
			return nil, nil, fsError(err, "file.read", args.Path)
		}
		if n == 0 {
			break
		}
		filled += n
		offset += int64(n)
	}
	truncated := int64(filled) > args.MaxBytes
	if truncated {
		filled = int(args.MaxBytes)
	}
	return &protocol.FileReadResult{Size: st.Size, Truncated: truncated}, buf[:filled], nil
}

func fileType(mode uint32) string {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		return "file"
	case syscall.S_IFDIR:
		return "dir"
	case syscall.S_IFLNK:
		return "symlink"
	}
	return "other"
}

// describe is lstat of path as a FileInfo (with the link target when asked).
func describe(path, name string, names *idNames, withLink bool) (protocol.FileInfo, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return protocol.FileInfo{}, err
	}
	uid, gid := int64(st.Uid), int64(st.Gid)
	owner, group := names.user(st.Uid), names.group(st.Gid)
	p := path
	info := protocol.FileInfo{
		Name: name, Type: fileType(st.Mode), Size: st.Size, Mode: int64(st.Mode & 0o7777),
		MtimeMs: float64(st.Mtim.Sec)*1000 + float64(st.Mtim.Nsec)/1e6,
		Path:    &p, UID: &uid, GID: &gid, Owner: &owner, Group: &group,
	}
	if withLink && st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
		if target, err := os.Readlink(path); err == nil {
			info.LinkTarget = &target
		}
	}
	return info, nil
}

func baseName(path string) string {
	name := filepath.Base(path)
	if name == "/" || name == "." {
		return "/"
	}
	return name
}

func (a *Agent) FileStat(c *Call, args *protocol.FileStatArgs, body []byte) (*protocol.FileInfo, []byte, error) {
	info, err := describe(args.Path, baseName(args.Path), loadIDNames(), true)
	if err != nil {
		return nil, nil, fsError(err, "file.stat", args.Path)
	}
	return &info, nil, nil
}

func (a *Agent) FileList(c *Call, args *protocol.FileListArgs, body []byte) (*protocol.FileListResult, []byte, error) {
	limit := protocol.MaxListEntries
	if args.MaxEntries != nil {
		limit = int(*args.MaxEntries)
	}
	depth := 1
	if args.Depth != nil {
		depth = int(*args.Depth)
	}
	names := loadIDNames()
	entries := make([]protocol.FileInfo, 0, 16)
	truncated := false
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		f, err := os.Open(dir)
		if err != nil {
			return err
		}
		children, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return err
		}
		sort.Strings(children)
		for _, name := range children {
			if len(entries) >= limit {
				truncated = true
				return nil
			}
			full := filepath.Join(dir, name)
			info, err := describe(full, name, names, false)
			if err != nil {
				// Removed between readdir and lstat: still listed, as what little is known.
				p := full
				info = protocol.FileInfo{Name: name, Type: "other", Path: &p}
			}
			entries = append(entries, info)
			if info.Type == "dir" && level < depth {
				if err := walk(full, level+1); err != nil && level == 0 {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(args.Path, 1); err != nil {
		return nil, nil, fsError(unwrapPath(err), "file.list", args.Path)
	}
	return &protocol.FileListResult{Entries: entries, Truncated: truncated}, nil, nil
}

func (a *Agent) FileRemove(c *Call, args *protocol.FileRemoveArgs, body []byte) (*protocol.FileRemoveResult, []byte, error) {
	if filepath.Clean(args.Path) == "/" {
		return nil, nil, invalidArgument("file.remove: refusing to remove /")
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(args.Path, &st); err != nil {
		return nil, nil, fsError(err, "file.remove", args.Path)
	}
	recursive := args.Recursive != nil && *args.Recursive
	var err error
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		if recursive {
			err = os.RemoveAll(args.Path)
		} else if err = syscall.Rmdir(args.Path); err == syscall.ENOTEMPTY || err == syscall.EEXIST {
			return nil, nil, newError(protocol.CodeConflict, "file.remove %s: directory not empty (pass recursive to remove it)", args.Path)
		}
	} else {
		err = syscall.Unlink(args.Path)
	}
	if err != nil {
		return nil, nil, fsError(unwrapPath(err), "file.remove", args.Path)
	}
	return &protocol.FileRemoveResult{}, nil, nil
}

func (a *Agent) FileMkdir(c *Call, args *protocol.FileMkdirArgs, body []byte) (*protocol.FileMkdirResult, []byte, error) {
	u, err := ownerFor("file.mkdir", args.User)
	if err != nil {
		return nil, nil, err
	}
	mode := os.FileMode(0o755)
	if args.Mode != nil {
		mode = os.FileMode(*args.Mode)
	}
	created := false
	if args.Parents == nil || *args.Parents {
		created, err = mkdirAll(args.Path, mode, u)
	} else {
		err = os.Mkdir(args.Path, mode)
		if err == nil {
			created = true
			err = chownTo(args.Path, u)
		} else if errors.Is(err, os.ErrExist) {
			if st, serr := os.Stat(args.Path); serr == nil && st.IsDir() {
				err = nil
			}
		}
	}
	if err != nil {
		if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, os.ErrExist) {
			return nil, nil, newError(protocol.CodeConflict, "file.mkdir %s: it or a parent exists and is not a directory", args.Path)
		}
		return nil, nil, fsError(unwrapPath(err), "file.mkdir", args.Path)
	}
	if created && args.Mode != nil {
		_ = os.Chmod(args.Path, mode) // the umask filtered it
	}
	info, err := describe(args.Path, baseName(args.Path), loadIDNames(), false)
	if err != nil {
		return nil, nil, fsError(err, "file.mkdir", args.Path)
	}
	return &protocol.FileMkdirResult{Created: created, Entry: info}, nil, nil
}

func (a *Agent) FileMove(c *Call, args *protocol.FileMoveArgs, body []byte) (*protocol.FileInfo, []byte, error) {
	u, err := ownerFor("file.move", args.User)
	if err != nil {
		return nil, nil, err
	}
	if filepath.Clean(args.Source) == "/" {
		return nil, nil, invalidArgument("file.move: refusing to move /")
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(args.Source, &st); err != nil {
		return nil, nil, fsError(err, "file.move", args.Source)
	}
	if _, err := mkdirAll(filepath.Dir(args.Destination), 0o755, u); err != nil {
		return nil, nil, fsError(unwrapPath(err), "file.move", args.Destination)
	}
	if err := os.Rename(args.Source, args.Destination); err != nil {
		return nil, nil, fsError(unwrapPath(err), "file.move", args.Source+" -> "+args.Destination)
	}
	info, err := describe(args.Destination, baseName(args.Destination), loadIDNames(), true)
	if err != nil {
		return nil, nil, fsError(err, "file.move", args.Destination)
	}
	return &info, nil, nil
}
