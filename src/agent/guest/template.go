package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
)

// Template is what the image builder writes to /opt/forkd/template.json.
type Template struct {
	Name        string `json:"name"`
	Interpreter string `json:"interpreter"`
	// Problem: why the file could not be used; the agent still serves, reporting warm state "failed".
	Problem string `json:"-"`
}

const defaultTemplatePath = "/opt/forkd/template.json"

var tagPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

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
	return t
}
