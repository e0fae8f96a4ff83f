package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// execProgram replaces the launcher with the program: same pid, the namespaces and fds set up above.
func execProgram(p *Plan) error {
	program := p.Program
	if program[0] != '/' {
		found, err := exec.LookPath(program)
		if err != nil {
			return err
		}
		program = found
	}
	argv := append([]string{p.Program}, p.Args...)
	if err := syscall.Exec(program, argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", program, err)
	}
	return nil
}
