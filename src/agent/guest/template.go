package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"

	"forkd/src/agent/guest/protocol"
)

// Template is what the image builder writes to /opt/forkd/template.json.
type Template struct {
	Name        string `json:"name"`
	Interpreter string `json:"interpreter"`
	// Env and Workdir are the image's own settings (format-2 templates: an OCI image's config, env/workdir
	// steps): every process starts with Env over the agent's base environment, in Workdir unless the request
	// names a directory.
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	// Problem: why the file could not be used; the agent still serves, reporting warm state "failed".
	Problem string `json:"-"`
}

const defaultTemplatePath = "/opt/forkd/template.json"

var tagPattern = regexp.MustCompile(protocol.TagPattern)

func readTemplate(path string) Template {
	fail := func(err error) Template {
		return Template{Name: "unknown", Interpreter: "none", Problem: fmt.Sprintf("cannot use %s: %s", path, err)}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fail(err)
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return fail(err)
	}
	if !tagPattern.MatchString(t.Name) {
		return fail(fmt.Errorf("invalid template name %q", t.Name))
	}
	if t.Interpreter != "python" && t.Interpreter != "none" {
		return fail(fmt.Errorf("interpreter must be \"python\" or \"none\", not %q", t.Interpreter))
	}
	for k, v := range t.Env {
		if !envNamePattern.MatchString(k) || strings.ContainsRune(v, 0) {
			return fail(fmt.Errorf("invalid environment variable %q", k))
		}
	}
	if t.Workdir != "" && (!strings.HasPrefix(t.Workdir, "/") || strings.ContainsRune(t.Workdir, 0)) {
		return fail(fmt.Errorf("workdir must be an absolute path, not %q", t.Workdir))
	}
	return t
}

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// applyTemplateDefaults makes the image's environment and working directory every process's defaults.
func applyTemplateDefaults(t Template) {
	for k, v := range t.Env {
		baseEnv[k] = v
	}
	defaultCwd = t.Workdir
}
