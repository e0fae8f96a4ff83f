package main

import (
	"fmt"
	"os"
	"time"
)

// primeHotPaths runs each hot path once, silently, before the first hello: the parent VM is snapshotted
// after it, so its children start with these paths' first-use work (page faults of the agent's code and data,
// encoding/json's per-type caches, the kernel's dentries) already done.
func primeHotPaths(s *Server, a *Agent, log *Log) {
	started := time.Now()
	scratch := fmt.Sprintf("/tmp/.forkd-agent-prime-%d", os.Getpid())
	steps := []struct {
		name string
		run  func() error
	}{
		{"ping", func() error { return s.prime("ping", `{}`, nil) }},
		{"exec", func() error {
			return s.prime("exec", `{"argv":["true"],"stdin":"body","timeout_ms":30000}`, []byte("x"))
		}},
		{"file.write", func() error { return s.prime("file.write", fmt.Sprintf(`{"path":%q}`, scratch), []byte("x")) }},
		{"file.read", func() error { return s.prime("file.read", fmt.Sprintf(`{"path":%q,"max_bytes":16}`, scratch), nil) }},
		{"file.stat", func() error { return s.prime("file.stat", fmt.Sprintf(`{"path":%q}`, scratch), nil) }},
		{"file.list", func() error { return s.prime("file.list", `{"path":"/tmp","max_entries":16}`, nil) }},
		{"file.remove", func() error { return s.prime("file.remove", fmt.Sprintf(`{"path":%q}`, scratch), nil) }},
		{"proc.list", func() error { return s.prime("proc.list", `{}`, nil) }},
		{"restore", func() error {
			real := a.fixups
			a.fixups = dryRunFixups{}
			defer func() { a.fixups = real }()
			return s.prime("restore", `{"time_ns":"0","hostname":"prime","sandbox_id":"sb-000000000000"}`, make([]byte, 32))
		}},
		{"stop PIT", func() error { return a.fixups.StopPit() }},
	}
	for _, step := range steps {
		if err := step.run(); err != nil {
			log.Warn("priming a hot path failed (it will just be slower the first time)", Fields{"step": step.name, "error": err.Error()})
		}
	}
	log.Info("hot paths primed", Fields{"ms": time.Since(started).Milliseconds()})
}
