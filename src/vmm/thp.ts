/**
 * Transparent huge pages off for the QEMU processes we start. QEMU asks for huge pages for its translation cache
 * and a few RAM blocks; each child then faults in 2 MiB at a time where it uses a few KiB (measured under TCG:
 * 3 MiB more PSS and 2-3 ms more CPU per child). `prctl(PR_SET_THP_DISABLE)` is inherited across fork and exec,
 * so setting it once in this process covers every QEMU spawned after it; the host-wide setting is left alone.
 */
import { createRequire } from "node:module";

const PR_SET_THP_DISABLE = 41;
let done = false;

/** Best effort: a host without prctl/koffi just keeps THP as configured. */
export function disableThpForChildren(): void {
  if (done) return;
  done = true;
  try {
    const koffi = createRequire(import.meta.url)("koffi") as typeof import("koffi");
    const prctl = koffi
      .load("libc.so.6")
      .func("int prctl(int option, unsigned long a2, unsigned long a3, unsigned long a4, unsigned long a5)");
    prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
  } catch {
    // Not fatal: THP only costs memory and a little CPU.
  }
}
