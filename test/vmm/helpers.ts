/** Shared pieces of the vmm tests: temp run dirs, /proc checks, a line reader for the counter guest. */
import fs from "node:fs";
import type net from "node:net";
import os from "node:os";
import path from "node:path";
import type { TestContext } from "node:test";
import type { MachineSpec } from "../../src/vmm/qemu-args.js";

/** A temp dir removed after the test. Short paths: unix socket paths are limited to 107 bytes. */
export function tempDir(t: TestContext, prefix = "forkd-vmm-"): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** True while /proc/<pid> exists and is not a zombie. */
export function processAlive(pid: number): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    return state !== "Z";
  } catch {
    return false;
  }
}

/** Process group id of `pid` from /proc (field 5 of stat). */
export function processGroup(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return Number(fields[2]);
}

export async function waitUntil(what: string, predicate: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting until ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Minimal QEMU argv that starts paused with no guest: enough for QMP and process tests. */
export function pausedQemuArgs(qmpSocketPath: string): string[] {
  return [
    "-M",
    "microvm",
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-accel",
    "tcg,tb-size=8",
    "-m",
    "64M",
    "-S",
    "-qmp",
    `unix:${qmpSocketPath},server=on,wait=off`,
  ];
}

/** Line-oriented reader/writer over the agent socket for the counter guest (see test/fixtures/guest.ts). */
export class LineChannel {
  private buffered = "";
  private readonly lines: string[] = [];
  private waiter: ((line: string) => void) | undefined;
  private ended = false;
  /** Every line received, for failure messages. */
  readonly transcript: string[] = [];

  constructor(private readonly socket: net.Socket) {
    socket.setEncoding("utf8");
    socket.on("data", (data: string) => {
      this.buffered += data;
      for (let i = this.buffered.indexOf("\n"); i >= 0; i = this.buffered.indexOf("\n")) {
        const line = this.buffered.slice(0, i);
        this.buffered = this.buffered.slice(i + 1);
        this.transcript.push(line);
        if (this.waiter) {
          const w = this.waiter;
          this.waiter = undefined;
          w(line);
        } else this.lines.push(line);
      }
    });
    socket.on("close", () => {
      this.ended = true;
    });
  }

  send(line: string): void {
    this.socket.write(`${line}\n`);
  }

  next(timeoutMs = 60_000): Promise<string> {
    const line = this.lines.shift();
    if (line !== undefined) return Promise.resolve(line);
    if (this.ended)
      return Promise.reject(new Error(`channel closed; transcript: ${this.transcript.join(" | ")}`));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiter = undefined;
        reject(new Error(`no line within ${timeoutMs} ms; transcript: ${this.transcript.join(" | ")}`));
      }, timeoutMs);
      this.waiter = (l) => {
        clearTimeout(timer);
        resolve(l);
      };
    });
  }

  async request(line: string, timeoutMs?: number): Promise<string> {
    this.send(line);
    return this.next(timeoutMs);
  }
}

export interface CounterSpecInput {
  kernel: string;
  initrd: string;
  kernelCmdline: string;
  runDir: string;
  memoryFile: string;
  shared: boolean;
  tscKhz: number | undefined;
  name: string;
}

/** The counter guest's machine: TCG, 256 MiB file-backed RAM, agent port, rng. */
export function counterSpec(input: CounterSpecInput): MachineSpec {
  return {
    accel: "tcg",
    cpuModel: "max",
    memoryMiB: 256,
    vcpus: 1,
    memoryFile: { path: input.memoryFile, shared: input.shared },
    kernel: input.kernel,
    initrd: input.initrd,
    kernelCmdline: input.kernelCmdline,
    tscKhz: input.tscKhz,
    disk: null,
    agent: { socketPath: path.join(input.runDir, `${input.name}.agent.sock`) },
    qmpSocketPath: path.join(input.runDir, `${input.name}.qmp.sock`),
    consoleSocketPath: path.join(input.runDir, `${input.name}.console.sock`),
    rng: true,
  };
}
