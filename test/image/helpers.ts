/** Shared pieces of the image tests: booting a kernel under QEMU and reading files out of ext4 images. */
import { execFile, spawn } from "node:child_process";
import fs from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";

const execFileAsync = promisify(execFile);

/**
 * Under TCG on a busy host the guest kernel's TSC calibration against the PIT can fail, after which boot
 * stalls; telling it the host's TSC rate avoids the calibration. (The VMM layer makes the same choice.)
 */
async function tscKhzArg(): Promise<string> {
  const cpuinfo = await fs.readFile("/proc/cpuinfo", "utf8").catch(() => "");
  const mhz = /^cpu MHz\s*:\s*([0-9.]+)/m.exec(cpuinfo)?.[1];
  return mhz ? `tsc_early_khz=${Math.round(Number(mhz) * 1000)}` : "";
}

export interface BootResult {
  console: string;
  /** QEMU exited by itself (the guest powered off or panicked) rather than being killed at the deadline. */
  exitedByItself: boolean;
  seconds: number;
}

/**
 * Boots `kernel` + `initrd` (optionally with `disk` as a qcow2 overlay's backing file, so the image is never
 * modified) until QEMU exits or `deadlineMs` passes. QEMU is always killed before this returns.
 */
export async function bootGuest(opts: {
  workDir: string;
  kernel: string;
  initrd: string;
  disk?: string;
  diskFormat?: "raw";
  memoryMib?: number;
  deadlineMs?: number;
}): Promise<BootResult> {
  const consoleFile = path.join(opts.workDir, `console-${Date.now()}.log`);
  const args = [
    "-M",
    "microvm,acpi=on",
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-accel",
    "tcg,tb-size=16",
    "-cpu",
    "max",
    "-m",
    `${opts.memoryMib ?? 256}M`,
    "-smp",
    "1",
    "-kernel",
    opts.kernel,
    "-initrd",
    opts.initrd,
    "-append",
    `console=ttyS0 loglevel=4 panic=-1 root=/dev/vda ${await tscKhzArg()}`,
    "-chardev",
    `file,id=ser0,path=${consoleFile}`,
    "-serial",
    "chardev:ser0",
    "-no-reboot",
  ];
  if (opts.disk) {
    const overlay = path.join(opts.workDir, `overlay-${Date.now()}.qcow2`);
    await execFileAsync("qemu-img", [
      "create",
      "-q",
      "-f",
      "qcow2",
      "-b",
      path.resolve(opts.disk),
      "-F",
      "raw",
      overlay,
    ]);
    args.push(
      "-blockdev",
      `driver=qcow2,node-name=disk0,file.driver=file,file.filename=${overlay}`,
      "-device",
      "virtio-blk-device,drive=disk0,id=blk0",
    );
  }
  const started = performance.now();
  const qemu = spawn("qemu-system-x86_64", args, { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  qemu.stderr.on("data", (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4096);
  });
  const exited = new Promise<boolean>((resolve) => {
    qemu.on("exit", () => resolve(true));
    qemu.on("error", () => resolve(true));
  });
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<boolean>((resolve) => {
    timer = setTimeout(() => resolve(false), opts.deadlineMs ?? 120_000);
  });
  let exitedByItself = false;
  try {
    exitedByItself = await Promise.race([exited, deadline]);
  } finally {
    clearTimeout(timer);
    if (qemu.exitCode === null && qemu.signalCode === null) {
      qemu.kill("SIGKILL");
      await exited;
    }
  }
  const text = await fs.readFile(consoleFile, "utf8").catch(() => "");
  return {
    console: text + (stderr ? `\n[qemu stderr] ${stderr}` : ""),
    exitedByItself,
    seconds: (performance.now() - started) / 1000,
  };
}

/** A file's content inside an ext4 image, read with e2fsprogs' debugfs (no mount). */
export async function debugfsCat(image: string, guestPath: string): Promise<string> {
  const { stdout, stderr } = await execFileAsync("debugfs", ["-R", `cat ${guestPath}`, image], {
    maxBuffer: 64 * 1024 * 1024,
  });
  if (/not found|File not found/i.test(stderr)) throw new Error(`${guestPath} not in ${image}: ${stderr}`);
  return stdout;
}

/** `debugfs stat` of a guest path: owner uid and permission bits. */
export async function debugfsStat(image: string, guestPath: string): Promise<{ uid: number; mode: number }> {
  const { stdout, stderr } = await execFileAsync("debugfs", ["-R", `stat ${guestPath}`, image]);
  const uid = /User:\s+(\d+)/.exec(stdout)?.[1];
  const mode = /Mode:\s+0?([0-7]+)/.exec(stdout)?.[1];
  if (uid === undefined || mode === undefined)
    throw new Error(`cannot stat ${guestPath} in ${image}: ${stderr}`);
  return { uid: Number(uid), mode: Number.parseInt(mode, 8) };
}

/** Runs cpio with `archive` as its stdin and returns its stdout. */
async function cpioRead(archive: string, args: string[]): Promise<string> {
  const handle = await fs.open(archive, "r");
  try {
    const child = spawn("cpio", args, { stdio: [handle.fd, "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout?.on("data", (d: Buffer) => {
      out += d.toString();
    });
    child.stderr?.on("data", (d: Buffer) => {
      err += d.toString();
    });
    const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
    if (code !== 0) throw new Error(`cpio ${args.join(" ")} failed: ${err}`);
    return out;
  } finally {
    await handle.close();
  }
}

/** Entries of a cpio archive, in archive order. */
export async function cpioList(archive: string): Promise<string[]> {
  return (await cpioRead(archive, ["-it", "--quiet"])).split("\n").filter((l) => l !== "");
}

/** One member of a cpio archive. */
export function cpioExtract(archive: string, member: string): Promise<string> {
  return cpioRead(archive, ["-i", "--to-stdout", "--quiet", member]);
}
