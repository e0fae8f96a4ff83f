/**
 * Terminals: each an xterm.js instance (the terminal emulation is xterm.js's) on a WebSocket to a shell on a
 * pty in the sandbox. Several at once, side by side in a dock whose height can be dragged; each follows its
 * box's size (the pty is resized with it). Guest output only ever reaches xterm.js, never the page's markup;
 * hyperlinks the guest prints (OSC 8) are not opened and its window titles are ignored.
 */
import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import { useEffect, useRef, useState } from "preact/hooks";
import {
  CONSOLE_API,
  CSRF_PROTOCOL_PREFIX,
  TERMINAL_PROTOCOL,
  type TerminalClientMessage,
  type TerminalServerMessage,
} from "../../src/console/protocol.js";

export interface TerminalTab {
  key: string;
  sandboxId: string;
}

export function TerminalDock({
  terminals,
  csrf,
  onClose,
}: {
  terminals: TerminalTab[];
  csrf: string | null;
  onClose: (key: string) => void;
}) {
  return (
    <section class="dock" aria-label="terminals">
      {terminals.map((tab) => (
        <TerminalView key={tab.key} tab={tab} csrf={csrf} onClose={() => onClose(tab.key)} />
      ))}
    </section>
  );
}

function TerminalView({
  tab,
  csrf,
  onClose,
}: {
  tab: TerminalTab;
  csrf: string | null;
  onClose: () => void;
}) {
  const box = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState("connecting…");
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    const element = box.current;
    if (!element) return;
    const term = new Terminal({
      cursorBlink: true,
      scrollback: 5000,
      fontFamily: "ui-monospace, 'DejaVu Sans Mono', monospace",
      fontSize: 13,
      // OSC 8 links from the guest: shown, never opened.
      linkHandler: { activate: () => {} },
    });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(element);
    fit.fit();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = new URLSearchParams({
      sandbox: tab.sandboxId,
      cols: String(term.cols),
      rows: String(term.rows),
    });
    const protocols =
      csrf === null ? [TERMINAL_PROTOCOL] : [TERMINAL_PROTOCOL, `${CSRF_PROTOCOL_PREFIX}${csrf}`];
    const ws = new WebSocket(`${scheme}://${location.host}${CONSOLE_API}/terminal?${query}`, protocols);
    ws.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    let opened = false;
    let failed = false;
    const send = (data: Uint8Array | string) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(data);
    };
    ws.onopen = () => {
      opened = true;
      setStatus("starting the shell…");
    };
    ws.onmessage = (event) => {
      if (typeof event.data !== "string") {
        term.write(new Uint8Array(event.data as ArrayBuffer));
        return;
      }
      const message = JSON.parse(event.data) as TerminalServerMessage;
      if (message.type === "started") setStatus(`shell pid ${message.pid}`);
      else if (message.type === "exit") {
        setStatus(`exited (${message.signal ?? `status ${message.exit_code}`})`);
      } else {
        failed = true;
        setError(`${message.error} (${message.code})`);
      }
    };
    ws.onclose = (event) => {
      if (!opened) {
        setError("the daemon refused the terminal (session ended, or not allowed from this page)");
      } else if (!failed)
        setStatus((s) => (s.startsWith("exited") ? s : `closed (${event.reason || event.code})`));
    };
    const input = term.onData((data) => send(encoder.encode(data)));
    const binary = term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
    const resized = term.onResize(({ cols, rows }) => {
      send(JSON.stringify({ type: "resize", cols, rows } satisfies TerminalClientMessage));
    });
    const observer = new ResizeObserver(() => {
      if (element.clientWidth > 0 && element.clientHeight > 0) fit.fit();
    });
    observer.observe(element);
    term.focus();
    return () => {
      observer.disconnect();
      input.dispose();
      binary.dispose();
      resized.dispose();
      ws.close(1000, "closed in the console");
      term.dispose();
    };
  }, [tab.sandboxId, csrf]);

  return (
    <div class="terminal" data-testid={`terminal-${tab.sandboxId}`}>
      <div class="terminal-bar">
        <span class="mono">{tab.sandboxId}</span>
        <span class="muted" data-testid="terminal-status">
          {status}
        </span>
        {error && (
          <span class="error" role="alert">
            {error}
          </span>
        )}
        <span class="spacer" />
        <button type="button" onClick={onClose} aria-label="close terminal">
          ✕
        </button>
      </div>
      <div class="terminal-box" ref={box} />
    </div>
  );
}
