/**
 * The host's TSC frequency, which TCG guests need told to them.
 *
 * Why: under TCG the guest's RDTSC returns the host's TSC, and the guest kernel calibrates it against the
 * emulated PIT. When the host is busy (other VMs on a 2-core machine) the vCPU thread gets descheduled during
 * that calibration, the kernel logs "tsc: Unable to calibrate against PIT ... Marking TSC unstable", and the
 * boot then hangs for good at CPU bring-up. Measured here: 3 of 4 boots hung at load ~3.5; with
 * `tsc_early_khz=<host TSC kHz>` on the kernel command line, 5 of 5 booted under the same load.
 */
import fs from "node:fs";

/** /dev/kmsg records read at most while looking for the boot-time TSC line (the ring holds a few thousand). */
export const MAX_KMSG_RECORDS = 20_000;

const KMSG_PATTERNS = [
  /tsc: Refined TSC clocksource calibration: (\d+(?:\.\d+)?) MHz/,
  /tsc: Detected (\d+(?:\.\d+)?) MHz processor/,
];

export interface HostTsc {
  khz: number;
  /** Where the value came from, for diagnostics. */
  source: string;
}

/**
 * Best available host TSC frequency: the host kernel's own calibration from its log (exact), else the
 * "cpu MHz" of /proc/cpuinfo when the CPU has a constant TSC (close enough: the guest's clocksource watchdog
 * corrects a small error). Undefined when neither is available.
 */
export function detectHostTsc(): HostTsc | undefined {
  return fromKernelLog() ?? fromCpuinfo();
}

function fromKernelLog(): HostTsc | undefined {
  let fd: number;
  try {
    fd = fs.openSync("/dev/kmsg", fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  } catch {
    return undefined;
  }
  const found: (number | undefined)[] = [undefined, undefined];
  try {
    const buffer = Buffer.alloc(8192);
    for (let i = 0; i < MAX_KMSG_RECORDS; i++) {
      let n: number;
      try {
        n = fs.readSync(fd, buffer, 0, buffer.length, null);
      } catch (err) {
        // EAGAIN: end of the log. EPIPE: a record was overwritten while reading; keep going.
        if ((err as NodeJS.ErrnoException).code === "EPIPE") continue;
        break;
      }
      if (n <= 0) break;
      const record = buffer.toString("utf8", 0, n);
      KMSG_PATTERNS.forEach((pattern, index) => {
        const match = pattern.exec(record);
        if (match) found[index] = Math.round(Number(match[1]) * 1000);
      });
    }
  } finally {
    fs.closeSync(fd);
  }
  const index = found.findIndex((khz) => khz !== undefined && khz > 0);
  if (index < 0) return undefined;
  return { khz: found[index] as number, source: "host kernel log (tsc calibration)" };
}

function fromCpuinfo(): HostTsc | undefined {
  let cpuinfo: string;
  try {
    cpuinfo = fs.readFileSync("/proc/cpuinfo", "utf8");
  } catch {
    return undefined;
  }
  const first = cpuinfo.split("\n\n")[0] ?? "";
  const flags = /^flags\s*:(.*)$/m.exec(first)?.[1]?.split(/\s+/) ?? [];
  if (!flags.includes("constant_tsc")) return undefined;
  const mhz = /^cpu MHz\s*:\s*(\d+(?:\.\d+)?)/m.exec(first)?.[1];
  if (!mhz) return undefined;
  return { khz: Math.round(Number(mhz) * 1000), source: "/proc/cpuinfo cpu MHz (constant_tsc)" };
}
