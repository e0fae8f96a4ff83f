/**
 * KVM where a real probe boot says it works, TCG otherwise. `FORKD_ACCEL=tcg|kvm` forces a choice (e.g. to
 * compare the two on one host); forcing kvm where the probe failed is refused with the probe's reason.
 */
import path from "node:path";
import { ForkdError } from "../../common/errors.js";
import type { ForkdPaths } from "../../common/paths.js";
import type { BuiltImage } from "../../image/index.js";
import { type ConfinementConfig, resolveConfinement } from "../../isolation/confinement.js";
import { type AcceleratorProbe, PROBE_CACHE_FILE, probeAccelerator } from "../../vmm/accel.js";
import type { Accelerator } from "../../vmm/qemu-args.js";
import { confineSpec, vmStart } from "./vm-launch.js";

export interface AcceleratorChoice {
  accel: Accelerator;
  reason: string;
  /** Host TSC frequency handed to TCG guests so they skip calibrating it (see vmm/host-tsc.ts). */
  tscKhz: number | undefined;
}

/**
 * The probe boot of `image`'s kernel, answered from the per-boot cache when possible. The probe VM is
 * confined like every other VM (and dies with this process).
 */
export async function probeHost(
  paths: ForkdPaths,
  image: BuiltImage,
  options: { signal?: AbortSignal; refresh?: boolean; confinement?: ConfinementConfig } = {},
): Promise<AcceleratorProbe> {
  const confinement = options.confinement ?? (await resolveConfinement());
  return probeAccelerator({
    kernel: image.kernel,
    probeInitrd: image.probeInitrd,
    cacheFile: path.join(paths.hostState, PROBE_CACHE_FILE),
    signal: options.signal,
    refresh: options.refresh,
    confine: (plain, runDir) => {
      const spec = confineSpec(confinement, plain);
      return { spec, ...vmStart(confinement, { spec, runDir, dieWithParent: true }) };
    },
  });
}

export async function chooseAccelerator(
  paths: ForkdPaths,
  image: BuiltImage,
  options: { signal?: AbortSignal; env?: NodeJS.ProcessEnv; confinement?: ConfinementConfig } = {},
): Promise<AcceleratorChoice> {
  const forced = (options.env ?? process.env).FORKD_ACCEL;
  if (forced !== undefined && forced !== "kvm" && forced !== "tcg" && forced !== "auto" && forced !== "") {
    throw new ForkdError(
      "invalid_argument",
      `FORKD_ACCEL must be kvm, tcg or auto, got ${JSON.stringify(forced)}`,
    );
  }
  const probe = await probeHost(paths, image, options);
  if (forced === "tcg") return { accel: "tcg", reason: "forced by FORKD_ACCEL=tcg", tscKhz: probe.tscKhz };
  if (forced === "kvm" && !probe.kvm.usable) {
    throw new ForkdError("unavailable", `FORKD_ACCEL=kvm but KVM is not usable here: ${probe.kvm.reason}`);
  }
  if (probe.kvm.usable) return { accel: "kvm", reason: probe.kvm.reason, tscKhz: undefined };
  if (!probe.tcg.usable) {
    throw new ForkdError(
      "unavailable",
      `no accelerator can boot the guest kernel: kvm: ${probe.kvm.reason}; tcg: ${probe.tcg.reason}`,
    );
  }
  return { accel: "tcg", reason: `KVM not usable: ${probe.kvm.reason}`, tscKhz: probe.tscKhz };
}
