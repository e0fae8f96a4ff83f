package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func withAccounts(t *testing.T, passwd, group string) {
	t.Helper()
	dir := t.TempDir()
	oldPasswd, oldGroup := passwdFile, groupFile
	passwdFile, groupFile = filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	t.Cleanup(func() { passwdFile, groupFile = oldPasswd, oldGroup })
	if err := os.WriteFile(passwdFile, []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(groupFile, []byte(group), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLookupUserReadsPasswdAndGroups(t *testing.T) {
	withAccounts(t,
		"root:x:0:0:root:/root:/bin/bash\n# comment\nbroken line\nuser:x:1000:1000::/home/user:/bin/sh\n",
		"root:x:0:\nuser:x:1000:\nwheel:x:10:root,user\ndocker:x:999:user\nother:x:5:someone\n")
	u, err := lookupUser("exec", "user")
	if err != nil {
		t.Fatal(err)
	}
	want := &User{Name: "user", UID: 1000, GID: 1000, Groups: []uint32{1000, 10, 999}, Home: "/home/user", Shell: "/bin/sh"}
	if !reflect.DeepEqual(u, want) {
		t.Fatalf("got %+v, want %+v", u, want)
	}
	_, err = lookupUser("exec", "ghost")
	if err == nil || !strings.Contains(err.Error(), `no user "ghost"`) || err.(*AgentError).Code != "not_found" {
		t.Fatalf("got %v", err)
	}
	names := loadIDNames()
	if names.user(1000) != "user" || names.group(10) != "wheel" || names.user(4242) != "4242" {
		t.Fatalf("names %+v", names)
	}
}

func TestLookPathFollowsTheChildsPath(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "tool")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := lookPath("exec", "tool", "/nonexistent:"+dir, "/"); err != nil || got != prog {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := lookPath("exec", "data", dir, "/"); err == nil || err.(*AgentError).Code != "invalid_argument" {
		t.Fatalf("a file without exec bits: %v", err)
	}
	if _, err := lookPath("exec", "missing", dir, "/"); err == nil || err.(*AgentError).Code != "not_found" {
		t.Fatalf("missing: %v", err)
	}
	if got, err := lookPath("exec", "./tool", "", dir); err != nil || got != prog {
		t.Fatalf("relative to cwd: %q, %v", got, err)
	}
}
