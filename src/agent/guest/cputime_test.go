package main

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPUTime(t *testing.T) {
	// A command name with a space and a ')' of its own; utime 150 and stime 50 ticks are 2 s.
	line := "4242 (we ird) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 1 0 12 1000 10\n"
	got, ok := parseStatCPUTime(line)
	if !ok || got != 2*time.Second {
		t.Fatalf("got %v %v, want 2s true", got, ok)
	}
	if _, ok := parseStatCPUTime("4242 (truncated"); ok {
		t.Fatal("a line without its fields must not parse")
	}
}

func TestProcessCPUTimeOfThisProcess(t *testing.T) {
	deadline := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(deadline) {
	}
	if used, ok := processCPUTime(os.Getpid()); !ok || used <= 0 {
		t.Fatalf("this process's CPU time: %v %v", used, ok)
	}
	if _, ok := processCPUTime(-1); ok {
		t.Fatal("no such process must read as false")
	}
}
