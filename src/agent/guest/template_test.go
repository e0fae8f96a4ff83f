package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeTemplate(t *testing.T, body string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "template.json")
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestTemplateEnvAndWorkdirBecomeDefaults(t *testing.T) {
	dir := t.TempDir()
	tmpl := readTemplate(writeTemplate(t, `{"name":"x","interpreter":"none","env":{"APP_MODE":"prod","PATH":"/opt/app/bin:/usr/bin:/bin"},"workdir":"`+dir+`"}`))
	if tmpl.Problem != "" {
		t.Fatal(tmpl.Problem)
	}
	savedEnv := map[string]string{}
	for k, v := range baseEnv {
		savedEnv[k] = v
	}
	t.Cleanup(func() { baseEnv = savedEnv; defaultCwd = "" })
	applyTemplateDefaults(tmpl)
	l, err := prepareLaunch("exec", []string{"/bin/sh"}, map[string]string{"EXTRA": "1"}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Join(l.env, "\n")
	for _, want := range []string{"APP_MODE=prod", "PATH=/opt/app/bin:/usr/bin:/bin", "EXTRA=1", "LANG=C.UTF-8"} {
		if !strings.Contains(env, want) {
			t.Errorf("env lacks %s: %s", want, env)
		}
	}
	if l.cwd != dir {
		t.Errorf("cwd %s, want the template's workdir %s", l.cwd, dir)
	}
	other := "/"
	l, err = prepareLaunch("exec", []string{"/bin/sh"}, nil, &other, nil, nil)
	if err != nil || l.cwd != "/" {
		t.Fatalf("a request's cwd wins over the workdir: %v %v", l, err)
	}
}

func TestTemplateRejectsBadEnvAndWorkdir(t *testing.T) {
	for _, body := range []string{
		`{"name":"x","interpreter":"none","env":{"BAD NAME":"1"}}`,
		`{"name":"x","interpreter":"none","workdir":"relative/dir"}`,
	} {
		if tmpl := readTemplate(writeTemplate(t, body)); tmpl.Problem == "" {
			t.Errorf("accepted %s", body)
		}
	}
}
