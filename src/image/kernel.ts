/**
 * The guest kernel comes from Debian's kernel package. Its virtio and ext4 drivers are modules, so the
 * initramfs has to load them, in an order kmod computes: `depmod` indexes the extracted tree and
 * `modprobe --show-depends` lists hard dependencies and soft ones (ext4 needs a crc32c implementation at
 * mount time, which `modinfo -F depends` alone does not reveal).
 */
import fs from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { run, runText } from "./run.js";

/** Drivers the guest needs before it can mount its root disk and talk to the host. */
export const BOOT_MODULES = [
  "virtio_mmio", // microvm's virtio transport (devices found through ACPI)
  "virtio_blk", // root disk
  "virtio_console", // agent channel (virtio-serial)
  "virtio_rng", // entropy, so getrandom() never waits in a fresh guest
  "virtio_net", // optional NIC, for sandboxes with networking
  "ext4",
] as const;

export interface ExtractedKernel {
  /** `uname -r` of the kernel, e.g. "6.1.0-57-amd64". */
  release: string;
  vmlinuz: string;
  /** Directory the package was extracted into. */
  root: string;
}

export interface KernelModule {
  /** File name without .ko, as installed in the initramfs (e.g. "virtio-rng"). */
  name: string;
  file: string;
}

const RELEASE = /^[0-9][A-Za-z0-9._+-]*$/;

export async function extractKernel(
  deb: string,
  root: string,
  signal?: AbortSignal,
): Promise<ExtractedKernel> {
  await fs.mkdir(root, { recursive: true });
  await run("dpkg-deb", ["-x", deb, root], { signal, stdout: "ignore" });
  const releases = (await fs.readdir(path.join(root, "lib", "modules")).catch(() => [])).filter((r) =>
    RELEASE.test(r),
  );
  if (releases.length !== 1) {
    throw new ForkdError(
      "internal",
      `${path.basename(deb)}: expected one lib/modules/<release>, found ${releases}`,
    );
  }
  const release = releases[0]!;
  const vmlinuz = path.join(root, "boot", `vmlinuz-${release}`);
  const st = await fs.lstat(vmlinuz).catch(() => undefined);
  if (!st?.isFile()) throw new ForkdError("internal", `${path.basename(deb)} has no boot/vmlinuz-${release}`);
  return { release, vmlinuz, root };
}

/** The modules to insmod, dependencies first, each once. */
export async function moduleLoadOrder(
  kernel: ExtractedKernel,
  modules: readonly string[] = BOOT_MODULES,
  signal?: AbortSignal,
): Promise<KernelModule[]> {
  await run("depmod", ["-b", kernel.root, kernel.release], { signal, stdout: "ignore" });
  const modulesDir = path.join(kernel.root, "lib", "modules", kernel.release);
  const out = await runText(
    "modprobe",
    ["-d", kernel.root, "-S", kernel.release, "--show-depends", "-a", ...modules],
    { signal },
  );
  const order: KernelModule[] = [];
  const seen = new Set<string>();
  for (const line of out.split("\n")) {
    const m = /^insmod (\S+)/.exec(line);
    if (!m) continue; // "builtin <name>" needs no loading
    const file = path.resolve(m[1]!);
    if (seen.has(file)) continue;
    seen.add(file);
    if (!file.startsWith(`${modulesDir}/`)) {
      throw new ForkdError("internal", `modprobe named a module outside ${modulesDir}: ${file}`);
    }
    if (!file.endsWith(".ko")) {
      throw new ForkdError(
        "unavailable",
        `kernel ${kernel.release} has compressed modules (${file}), not supported yet`,
      );
    }
    const name = path.basename(file, ".ko");
    if (!/^[A-Za-z0-9_-]+$/.test(name))
      throw new ForkdError("internal", `unexpected module file name ${file}`);
    order.push({ name, file });
  }
  const names = new Set(order.map((m) => m.name.replaceAll("-", "_")));
  const missing = modules.filter((m) => !names.has(m) && !out.includes(`builtin ${m}`));
  if (missing.length > 0) {
    throw new ForkdError("internal", `kernel ${kernel.release} lacks modules: ${missing.join(", ")}`);
  }
  return order;
}
