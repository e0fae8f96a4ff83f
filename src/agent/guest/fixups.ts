/**
 * What a restored child must change before it does anything else: every child of one snapshot wakes up with
 * the parent's wall clock, the parent's kernel RNG state and the parent's hostname.
 *
 * The system implementation calls libc through koffi (Node has no clock_settime or ioctl). Host tests run the
 * agent as root on the host, so they use the dry-run implementation, which records instead of acting.
 */
import fs from "node:fs";
import { ForkdError } from "../../common/errors.js";
import { type Libc, loadLibc } from "./libc.js";

export interface Fixups {
  readonly kind: "system" | "dry-run";
  /** Sets CLOCK_REALTIME. */
  setRealtimeClock(timeNs: bigint): void;
  /** Mixes `entropy` into the kernel pool (credited) and forces the CRNG to reseed from it. */
  addEntropy(entropy: Buffer): void;
  setHostname(hostname: string): void;
  /** Exercises the native calls without changing anything, before the parent VM is snapshotted. */
  prime(): Promise<void>;
  /** Stops the i8254 PIT's periodic interrupt (see `stopPit`); done once, before the snapshot. */
  stopPit(): void;
}

export interface DryRunRecord {
  timeNs?: bigint;
  entropyBytes?: number;
  hostname?: string;
  pitStopped?: boolean;
}

export class DryRunFixups implements Fixups {
  readonly kind = "dry-run" as const;
  readonly applied: DryRunRecord = {};

  setRealtimeClock(timeNs: bigint): void {
    this.applied.timeNs = timeNs;
  }

  addEntropy(entropy: Buffer): void {
    this.applied.entropyBytes = entropy.length;
  }

  setHostname(hostname: string): void {
    this.applied.hostname = hostname;
  }

  async prime(): Promise<void> {}

  stopPit(): void {
    this.applied.pitStopped = true;
  }
}

const CLOCK_REALTIME = 0;
/** _IOW('R', 0x03, int[2]) and _IO('R', 0x07) from <linux/random.h>. */
const RNDADDENTROPY = 0x40085203;
const RNDRESEEDCRNG = 0x5207;
/** _IOR('R', 0x00, int): read-only, used by the self-test. */
const RNDGETENTCNT = 0x80045200;
const RANDOM_DEVICE = "/dev/urandom";

function failed(what: string, errno: number): ForkdError {
  return new ForkdError("internal", `${what} failed with errno ${errno}`);
}

export class SystemFixups implements Fixups {
  readonly kind = "system" as const;
  private readonly libc: Libc;
  /**
   * Opened once, before the snapshot: every syscall a restored child does not make is guest code TCG does not
   * have to translate afresh in that child (measured: each fix-up step costs ~20-60 ms of a child's first use).
   */
  private readonly randomFd: number;

  private constructor(libc: Libc, randomFd: number) {
    this.libc = libc;
    this.randomFd = randomFd;
  }

  static async create(): Promise<SystemFixups> {
    return new SystemFixups(await loadLibc(), fs.openSync(RANDOM_DEVICE, "r"));
  }

  setRealtimeClock(timeNs: bigint): void {
    const ts = { tv_sec: timeNs / 1_000_000_000n, tv_nsec: timeNs % 1_000_000_000n };
    if (this.libc.clockSettime(CLOCK_REALTIME, ts) !== 0) throw failed("clock_settime", this.libc.errno());
  }

  addEntropy(entropy: Buffer): void {
    // struct rand_pool_info { int entropy_count (bits); int buf_size (bytes); __u32 buf[]; }
    const info = Buffer.alloc(8 + entropy.length);
    info.writeInt32LE(entropy.length * 8, 0);
    info.writeInt32LE(entropy.length, 4);
    entropy.copy(info, 8);
    if (this.libc.ioctl(this.randomFd, RNDADDENTROPY, "void *", info) !== 0) {
      throw failed("ioctl RNDADDENTROPY", this.libc.errno());
    }
    if (this.libc.ioctl(this.randomFd, RNDRESEEDCRNG) !== 0)
      throw failed("ioctl RNDRESEEDCRNG", this.libc.errno());
  }

  setHostname(hostname: string): void {
    const name = Buffer.from(hostname, "utf8");
    if (this.libc.sethostname(name, name.length) !== 0) throw failed("sethostname", this.libc.errno());
  }

  async prime(): Promise<void> {
    await selfTest();
  }

  stopPit(): void {
    stopPit();
  }
}

/**
 * QEMU's emulated i8254 keeps interrupting on channel 0 (IRQ 0) after boot although this kernel keeps time
 * with the LAPIC timer and the TSC; under TCG each of those interrupts costs host CPU in every idle child.
 * Programming channel 0 as a one-shot (mode 0) with count 0 lets it expire once, after which QEMU stops its
 * timer, and every child restored from the snapshot inherits the stopped PIT. (`-machine pit=off` instead
 * breaks the kernel's early TSC calibration.)
 */
export function stopPit(): void {
  const PIT_COMMAND = 0x43;
  const PIT_CHANNEL0 = 0x40;
  const fd = fs.openSync("/dev/port", "r+");
  try {
    fs.writeSync(fd, Buffer.from([0x30]), 0, 1, PIT_COMMAND); // channel 0, low then high byte, mode 0
    fs.writeSync(fd, Buffer.from([0x00]), 0, 1, PIT_CHANNEL0);
    fs.writeSync(fd, Buffer.from([0x00]), 0, 1, PIT_CHANNEL0);
  } finally {
    fs.closeSync(fd);
  }
}

export interface SelfTestReport {
  node: string;
  koffi: string;
  realtimeNs: string;
  entropyCount: number;
  /** errno of clock_settime on CLOCK_MONOTONIC (always EINVAL = 22): proves the timespec marshalling. */
  settimeProbeErrno: number;
  /** errno of RNDADDENTROPY with a negative entropy count (EINVAL = 22, checked before anything is mixed). */
  addEntropyProbeErrno: number;
  /** errno of sethostname with a 65-byte name (EINVAL = 22, checked before anything changes). */
  sethostnameProbeErrno: number;
}

const CLOCK_MONOTONIC = 1;

/**
 * Proves koffi and the libc bindings work in this root filesystem without changing anything: reads the clock
 * and the entropy count, and calls clock_settime, RNDADDENTROPY and sethostname with arguments the kernel
 * rejects before acting, through the same bindings the fix-ups use.
 */
export async function selfTest(): Promise<SelfTestReport> {
  const libc = await loadLibc();
  const ts: { tv_sec?: bigint | number; tv_nsec?: bigint | number } = {};
  if (libc.clockGettime(CLOCK_REALTIME, ts) !== 0) throw failed("clock_gettime", libc.errno());
  const realtimeNs = BigInt(ts.tv_sec ?? 0) * 1_000_000_000n + BigInt(ts.tv_nsec ?? 0);
  const settimeResult = libc.clockSettime(CLOCK_MONOTONIC, { tv_sec: 1n, tv_nsec: 0n });
  const settimeProbeErrno = settimeResult === 0 ? 0 : libc.errno();
  const count = Buffer.alloc(4);
  const invalid = Buffer.alloc(8 + 32);
  invalid.writeInt32LE(-1, 0);
  invalid.writeInt32LE(32, 4);
  const fd = fs.openSync(RANDOM_DEVICE, "r");
  let addEntropyProbeErrno: number;
  try {
    if (libc.ioctl(fd, RNDGETENTCNT, "void *", count) !== 0) throw failed("ioctl RNDGETENTCNT", libc.errno());
    addEntropyProbeErrno = libc.ioctl(fd, RNDADDENTROPY, "void *", invalid) === 0 ? 0 : libc.errno();
  } finally {
    fs.closeSync(fd);
  }
  const tooLong = Buffer.alloc(65, 0x61);
  const sethostnameProbeErrno = libc.sethostname(tooLong, tooLong.length) === 0 ? 0 : libc.errno();
  return {
    node: process.version,
    koffi: libc.koffiVersion,
    realtimeNs: realtimeNs.toString(),
    entropyCount: count.readInt32LE(0),
    settimeProbeErrno,
    addEntropyProbeErrno,
    sethostnameProbeErrno,
  };
}
