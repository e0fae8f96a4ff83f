package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// nft finishes in milliseconds; this only catches a wedged one.
const nftTimeout = 30 * time.Second

// At most this much of nft's output is kept for an error message.
const maxNftOutput = 64 * 1024

// rules applies an nft script inside the namespace, after its sysctls: the thread enters the namespace and
// nft, forked from it, starts there. One process, one transaction.
func rules(r *Request) error {
	if err := enterNamedNetns(r.Netns); err != nil {
		return err
	}
	if err := writeSysctls(r.Sysctls); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(r.Script)
	out := &boundedBuffer{limit: maxNftOutput}
	cmd.Stdout = out
	cmd.Stderr = out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft -f - in %s: %s", r.Netns, firstNonEmpty(strings.TrimSpace(out.String()), err.Error()))
	}
	return nil
}

type boundedBuffer struct {
	bytes.Buffer
	limit int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.Len(); room > 0 {
		if len(p) > room {
			b.Buffer.Write(p[:room])
		} else {
			b.Buffer.Write(p)
		}
	}
	return len(p), nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
