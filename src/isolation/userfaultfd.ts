/**
 * Live BRANCH runs QEMU's background snapshot, which write-protects guest RAM with a userfaultfd that QEMU
 * creates itself. QEMU 7.2 makes it with the plain userfaultfd(2) system call, which an unprivileged process
 * may only use (for faults in kernel mode too, as a KVM guest's are) when vm.unprivileged_userfaultfd is 1;
 * QEMU 8.1 and later can open /dev/userfaultfd instead, which is governed by that node's permissions alone.
 *
 * The trade-off: with the sysctl at 1 every local user may handle kernel-mode page faults of their own
 * memory, which widens race windows for kernel exploits. So the daemon sets it only when a live BRANCH of a
 * confined QEMU is first asked for, and not at all with `--no-unprivileged-userfaultfd` (live BRANCH of
 * confined sandboxes is then refused).
 */
import { readFile, writeFile } from "node:fs/promises";

export const UNPRIVILEGED_USERFAULTFD_SYSCTL = "/proc/sys/vm/unprivileged_userfaultfd";

/** "1" or "0" as the kernel has it, or null where the sysctl does not exist (then the call is ungated). */
export async function unprivilegedUserfaultfd(): Promise<"0" | "1" | null> {
  const value = await readFile(UNPRIVILEGED_USERFAULTFD_SYSCTL, "utf8").catch(() => null);
  if (value === null) return null;
  return value.trim() === "1" ? "1" : "0";
}

/** Sets vm.unprivileged_userfaultfd to 1 if it is not. Resolves true when it changed it. */
export async function allowUnprivilegedUserfaultfd(): Promise<boolean> {
  if ((await unprivilegedUserfaultfd()) !== "0") return false;
  await writeFile(UNPRIVILEGED_USERFAULTFD_SYSCTL, "1\n");
  return true;
}
