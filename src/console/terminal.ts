/**
 * Terminals: a WebSocket per terminal, bridged to a shell on a pseudo-terminal in the sandbox (the guest
 * agent's proc.start with a pty, proc.input, proc.resize). Binary frames carry bytes both ways (the browser's
 * xterm.js does the terminal emulation); text frames carry control messages (protocol.ts). Output waits for the
 * WebSocket to drain (the agent client buffers a bounded amount and then detaches), input is queued up to a
 * bound, and closing either end ends the other: a closed WebSocket hangs up the shell (SIGHUP, then SIGKILL of
 * its process group), an exited shell closes the WebSocket with its exit status.
 */
import type http from "node:http";
import type net from "node:net";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { type RawData, type WebSocket, WebSocketServer } from "ws";
import type { ProcHandle } from "../agent/host/types.js";
import { PtySize } from "../agent/protocol/ops.js";
import { errorMessage, ForkdError } from "../common/errors.js";
import { assertSandboxRef } from "../common/names.js";
import type { SandboxService } from "../controller/sandbox-service.js";
import { TERMINAL_PROTOCOL, type TerminalClientMessage, type TerminalServerMessage } from "./protocol.js";

export const DEFAULT_MAX_TERMINALS = 32;
/** Largest frame a browser may send (keystrokes and pastes). */
const MAX_FRAME_BYTES = 64 * 1024;
/** Input queued for the guest beyond this closes the terminal (a paste the guest cannot take that fast). */
const MAX_QUEUED_INPUT_BYTES = 1024 * 1024;
/** Output not yet written to the WebSocket beyond which reading from the guest pauses. */
const OUTPUT_HIGH_WATER_BYTES = 1024 * 1024;
/** What the agent client may buffer for a terminal that is paused; beyond it the terminal ends. */
const AGENT_BUFFER_BYTES = 4 * 1024 * 1024;
/** After SIGHUP, how long a shell gets before its process group is killed. */
const HANGUP_GRACE_MS = 2000;

/** A login shell: bash where the image has it, else sh; in root's home. */
export const SHELL_ARGV = [
  "/bin/sh",
  "-c",
  'cd "$HOME" 2>/dev/null; if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l',
];
const SHELL_ENV = { TERM: "xterm-256color", COLORTERM: "truecolor", HOME: "/root", LANG: "C.UTF-8" };

const checkSize = TypeCompiler.Compile(PtySize);

interface Log {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
}

/** The WebSocket endpoint; one per daemon, shared by its listeners. */
export class TerminalServer {
  private readonly wss = new WebSocketServer({
    noServer: true,
    maxPayload: MAX_FRAME_BYTES,
    perMessageDeflate: false,
    handleProtocols: (offered) => (offered.has(TERMINAL_PROTOCOL) ? TERMINAL_PROTOCOL : false),
  });
  private readonly open = new Set<Terminal>();

  constructor(
    private readonly log: Log,
    private readonly maxTerminals = DEFAULT_MAX_TERMINALS,
  ) {}

  get count(): number {
    return this.open.size;
  }

  /**
   * Upgrades an authorized request. What is wrong with the request itself (the sandbox, its size, too many
   * terminals) is answered on the WebSocket as an error message, so the page can show the daemon's words; only a
   * request without the terminal subprotocol is refused before the upgrade (it is not the console's). `sandboxes`:
   * the caller's view of them.
   */
  accept(
    req: http.IncomingMessage,
    socket: net.Socket,
    head: Buffer,
    caller: string,
    sandboxes: SandboxService,
  ): void {
    const offered = String(req.headers["sec-websocket-protocol"] ?? "")
      .split(",")
      .map((p) => p.trim());
    if (!offered.includes(TERMINAL_PROTOCOL)) {
      throw new ForkdError(
        "invalid_argument",
        `the terminal WebSocket needs the subprotocol ${TERMINAL_PROTOCOL}`,
      );
    }
    this.wss.handleUpgrade(req, socket, head, (ws) => {
      let target: { id: string; size: PtySize };
      try {
        target = this.target(sandboxes, req.url ?? "/");
      } catch (err) {
        ws.on("error", () => {});
        const code = err instanceof ForkdError ? err.code : "internal";
        ws.send(
          JSON.stringify({ type: "error", error: errorMessage(err), code } satisfies TerminalServerMessage),
        );
        ws.close(1008, "the terminal cannot be opened");
        return;
      }
      const terminal = new Terminal(ws, sandboxes, target.id, target.size, this.log);
      this.open.add(terminal);
      this.log.info({ sandbox: target.id, caller }, "terminal opened");
      terminal.finished.then(() => {
        this.open.delete(terminal);
        this.log.info({ sandbox: target.id, caller }, "terminal closed");
      });
    });
  }

  /** The sandbox and size a terminal request names (query `sandbox`, `cols`, `rows`), checked. */
  private target(sandboxes: SandboxService, url: string): { id: string; size: PtySize } {
    const query = new URL(url, "http://terminal").searchParams;
    const id = assertSandboxRef(query.get("sandbox") ?? "");
    const size = { cols: Number(query.get("cols") ?? 80), rows: Number(query.get("rows") ?? 24) };
    if (!checkSize.Check(size))
      throw new ForkdError("invalid_argument", "cols and rows must be integers in 1..1000");
    const info = sandboxes.get(id);
    if (info.status !== "running")
      throw new ForkdError("conflict", `sandbox ${id} is ${info.status}: no shell to open`);
    if (this.open.size >= this.maxTerminals) {
      throw new ForkdError("unavailable", `${this.maxTerminals} terminals are open already: close one first`);
    }
    return { id: info.id, size };
  }

  /** Closes every terminal (their shells are hung up) and waits for them. */
  async close(): Promise<void> {
    const all = [...this.open];
    for (const terminal of all) terminal.close(1001, "the daemon is stopping");
    await Promise.all(all.map((t) => t.finished));
    this.wss.close();
  }
}

class Terminal {
  readonly finished: Promise<void>;
  private handle: ProcHandle | undefined;
  private pid: number | undefined;
  private exited = false;
  private inputChain: Promise<void> = Promise.resolve();
  private queuedInput = 0;
  private unsent = 0;
  private drained: (() => void) | undefined;
  private readonly wsClosed: Promise<void>;

  constructor(
    private readonly ws: WebSocket,
    private readonly sandboxes: SandboxService,
    private readonly sandboxId: string,
    size: { cols: number; rows: number },
    private readonly log: Log,
  ) {
    ws.on("error", () => {});
    ws.on("message", (data, isBinary) => this.onMessage(data, isBinary));
    this.wsClosed = new Promise<void>((resolve) => ws.once("close", () => resolve()));
    this.finished = Promise.all([this.run(size), this.wsClosed.then(() => this.hangUp())]).then(() => {});
  }

  close(code: number, reason: string): void {
    if (this.ws.readyState === this.ws.OPEN || this.ws.readyState === this.ws.CONNECTING) {
      this.ws.close(code, reason);
    }
  }

  private async run(size: { cols: number; rows: number }): Promise<void> {
    try {
      const handle = this.sandboxes.procs.start(this.sandboxId, SHELL_ARGV, {
        pty: size,
        env: SHELL_ENV,
        maxBufferedBytes: AGENT_BUFFER_BYTES,
      });
      this.handle = handle;
      this.pid = await handle.pid;
      this.sendControl({ type: "started", pid: this.pid });
      for await (const chunk of handle.output) {
        if (this.ws.readyState !== this.ws.OPEN) break;
        await this.sendOutput(chunk.data);
      }
      const end = await handle.done;
      this.exited = true;
      this.sendControl({ type: "exit", exit_code: end.exitCode, signal: end.signal });
      this.close(1000, "the shell exited");
    } catch (err) {
      if (this.ws.readyState === this.ws.OPEN) {
        const code = err instanceof ForkdError ? err.code : "internal";
        this.sendControl({ type: "error", error: errorMessage(err), code });
        this.close(1011, "the terminal failed");
      }
    }
  }

  private onMessage(data: RawData, isBinary: boolean): void {
    const bytes = Buffer.isBuffer(data)
      ? data
      : Array.isArray(data)
        ? Buffer.concat(data)
        : Buffer.from(data);
    if (isBinary) {
      this.queueInput(bytes);
      return;
    }
    let message: TerminalClientMessage;
    try {
      message = JSON.parse(bytes.toString("utf8")) as TerminalClientMessage;
    } catch {
      this.close(1007, "control frames must be JSON");
      return;
    }
    if (message?.type === "resize") {
      const size = { cols: message.cols, rows: message.rows };
      if (!checkSize.Check(size)) {
        this.sendControl({
          type: "error",
          error: "cols and rows must be integers in 1..1000",
          code: "invalid_argument",
        });
        return;
      }
      this.afterInput(() =>
        this.pid === undefined
          ? undefined
          : this.sandboxes.procs.resize(this.sandboxId, { pid: this.pid }, size),
      );
      return;
    }
    this.close(1008, "unknown control message");
  }

  private queueInput(bytes: Buffer): void {
    this.queuedInput += bytes.length;
    if (this.queuedInput > MAX_QUEUED_INPUT_BYTES) {
      this.close(1008, "input arrives faster than the sandbox takes it");
      return;
    }
    this.afterInput(async () => {
      try {
        if (this.pid !== undefined)
          await this.sandboxes.procs.input(this.sandboxId, { pid: this.pid }, bytes);
      } finally {
        this.queuedInput -= bytes.length;
      }
    });
  }

  /** Input and resizes reach the guest in the order they were sent, each after the shell started. */
  private afterInput(step: () => Promise<void> | undefined): void {
    this.inputChain = this.inputChain
      .then(async () => {
        await this.handle?.pid;
        await step();
      })
      .catch((err: unknown) => {
        if (!this.exited)
          this.log.warn({ sandbox: this.sandboxId, err: errorMessage(err) }, "terminal input failed");
      });
  }

  private async sendOutput(data: Buffer): Promise<void> {
    this.unsent += data.length;
    this.ws.send(data, { binary: true }, () => {
      this.unsent -= data.length;
      if (this.unsent <= OUTPUT_HIGH_WATER_BYTES / 4) this.drained?.();
    });
    if (this.unsent > OUTPUT_HIGH_WATER_BYTES) {
      await Promise.race([
        new Promise<void>((resolve) => {
          this.drained = resolve;
        }),
        this.wsClosed,
      ]);
      this.drained = undefined;
    }
  }

  private sendControl(message: TerminalServerMessage): void {
    if (this.ws.readyState === this.ws.OPEN) this.ws.send(JSON.stringify(message));
  }

  /** The WebSocket is gone: end the shell (hang up, then kill its process group) and stop following it. */
  private async hangUp(): Promise<void> {
    const handle = this.handle;
    if (!handle || this.exited) return;
    const pid = await handle.pid.catch(() => undefined);
    if (pid === undefined) return;
    const selector = { pid };
    const ended = handle.done.then(
      () => true,
      () => true,
    );
    await this.sandboxes.procs.signal(this.sandboxId, selector, "SIGHUP").catch(() => {});
    const timer = new Promise<boolean>((resolve) =>
      setTimeout(() => resolve(false), HANGUP_GRACE_MS).unref(),
    );
    if (!(await Promise.race([ended, timer]))) {
      await this.sandboxes.procs.signal(this.sandboxId, selector, "SIGKILL").catch(() => {});
      await Promise.race([ended, new Promise((r) => setTimeout(r, HANGUP_GRACE_MS).unref())]);
    }
    handle.detach();
  }
}
