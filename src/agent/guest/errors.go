package main

import (
	"errors"
	"fmt"
	"syscall"
	"unicode/utf16"

	"forkd/src/agent/guest/protocol"
)

// AgentError is an error with a catalogue code (src/common/errors.ts) and a message naming the op and field.
type AgentError struct {
	Code    string
	Message string
}

func (e *AgentError) Error() string { return e.Message }

func newError(code, format string, args ...any) *AgentError {
	return &AgentError{Code: code, Message: fmt.Sprintf(format, args...)}
}

func invalidArgument(format string, args ...any) *AgentError {
	return newError(protocol.CodeInvalidArgument, format, args...)
}

func notFound(format string, args ...any) *AgentError {
	return newError(protocol.CodeNotFound, format, args...)
}

var errnoCodes = map[syscall.Errno]string{
	syscall.ENOENT:       protocol.CodeNotFound,
	syscall.EEXIST:       protocol.CodeConflict,
	syscall.ENOTEMPTY:    protocol.CodeConflict,
	syscall.EBUSY:        protocol.CodeConflict,
	syscall.ENOTDIR:      protocol.CodeInvalidArgument,
	syscall.EISDIR:       protocol.CodeInvalidArgument,
	syscall.EACCES:       protocol.CodeInvalidArgument,
	syscall.EPERM:        protocol.CodeInvalidArgument,
	syscall.EROFS:        protocol.CodeInvalidArgument,
	syscall.ELOOP:        protocol.CodeInvalidArgument,
	syscall.ENAMETOOLONG: protocol.CodeInvalidArgument,
	syscall.EINVAL:       protocol.CodeInvalidArgument,
	syscall.EXDEV:        protocol.CodeInvalidArgument,
	syscall.ENOSPC:       protocol.CodeUnavailable,
	syscall.EDQUOT:       protocol.CodeUnavailable,
	syscall.EMFILE:       protocol.CodeUnavailable,
	syscall.ENFILE:       protocol.CodeUnavailable,
}

var errnoNames = map[syscall.Errno]string{
	syscall.ENOENT: "ENOENT", syscall.EEXIST: "EEXIST", syscall.ENOTEMPTY: "ENOTEMPTY", syscall.EBUSY: "EBUSY",
	syscall.ENOTDIR: "ENOTDIR", syscall.EISDIR: "EISDIR", syscall.EACCES: "EACCES", syscall.EPERM: "EPERM",
	syscall.EROFS: "EROFS", syscall.ELOOP: "ELOOP", syscall.ENAMETOOLONG: "ENAMETOOLONG", syscall.EINVAL: "EINVAL",
	syscall.EXDEV: "EXDEV", syscall.ENOSPC: "ENOSPC", syscall.EDQUOT: "EDQUOT", syscall.EMFILE: "EMFILE",
	syscall.ENFILE: "ENFILE", syscall.EIO: "EIO", syscall.ENXIO: "ENXIO",
}

// fsError maps a filesystem error to a catalogue error: "file.read /x: no such file or directory (ENOENT)".
func fsError(err error, op, target string) error {
	var agentErr *AgentError
	if errors.As(err, &agentErr) {
		return agentErr
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		code, ok := errnoCodes[errno]
		if !ok {
			code = protocol.CodeInternal
		}
		name := errnoNames[errno]
		if name == "" {
			name = fmt.Sprintf("errno %d", int(errno))
		}
		return newError(code, "%s %s: %s (%s)", op, target, errno.Error(), name)
	}
	return newError(protocol.CodeInternal, "%s %s: %s", op, target, err.Error())
}

// wireError is the {code, message} of any error, the message cut to the wire limit.
func wireError(err error) protocol.WireError {
	var agentErr *AgentError
	if errors.As(err, &agentErr) {
		return protocol.WireError{Code: agentErr.Code, Message: boundMessage(agentErr.Message)}
	}
	return protocol.WireError{Code: protocol.CodeInternal, Message: boundMessage(err.Error())}
}

// boundMessage cuts a message to MaxErrorMessageChars UTF-16 units (as the host counts), marking the cut.
func boundMessage(message string) string {
	units := utf16.Encode([]rune(message))
	if len(units) <= protocol.MaxErrorMessageChars {
		return message
	}
	return string(utf16.Decode(units[:protocol.MaxErrorMessageChars-14])) + " …(truncated)"
}
