package main

import (
	"encoding/json"
	"os"
	"sync"
)

// Log writes one JSON line per event to stderr (the guest console as PID 1, the test's stderr with --stdio).
// Never stdout: with --stdio, stdout is the protocol.
type Log struct {
	mu sync.Mutex
}

// Fields are a log line's extra fields.
type Fields map[string]any

func (l *Log) emit(level, msg string, fields Fields) {
	line := make(map[string]any, len(fields)+3)
	for k, v := range fields {
		line[k] = v
	}
	line["level"] = level
	line["src"] = "forkd-agent"
	line["msg"] = msg
	b, err := json.Marshal(line)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"level": level, "src": "forkd-agent", "msg": msg})
	}
	l.mu.Lock()
	os.Stderr.Write(append(b, '\n'))
	l.mu.Unlock()
}

func (l *Log) Info(msg string, fields Fields)  { l.emit("info", msg, fields) }
func (l *Log) Warn(msg string, fields Fields)  { l.emit("warn", msg, fields) }
func (l *Log) Error(msg string, fields Fields) { l.emit("error", msg, fields) }
