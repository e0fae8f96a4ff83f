/**
 * Template -> warm snapshot. The parent boots with its RAM in a file inside the snapshot's staging directory,
 * so saving it costs only the device state (milliseconds): the guest already wrote its memory into the file.
 */
import { rm } from "node:fs/promises";
import path from "node:path";
import { AgentClient } from "../agent/host/client.js";
import { deadlineSignal } from "../common/deadline.js";
import { errorMessage, ForkdError } from "../common/errors.js";
import { assertTag } from "../common/names.js";
import type { ForkdPaths } from "../common/paths.js";
import { type BuiltImage, buildImage } from "../image/build.js";
import { loadTemplate } from "../image/template.js";
import type { SnapshotManifest } from "../store/manifest.js";
import { SnapshotStore } from "../store/snapshot-store.js";
import { launchVm, type VmHandle } from "../vmm/launch.js";
import { describeExit } from "../vmm/qemu-process.js";
import { createOverlay, qemuVersion } from "../vmm/qemu-tools.js";
import { saveDeviceState } from "../vmm/snapshot.js";
import { chooseAccelerator } from "./accelerator.js";
import { newSandboxId } from "./ids.js";
import { cpuModelFor, type MachineShape, machineSpec, SNAPSHOT_FILES } from "./machine.js";

/** A cold boot to the agent's hello: ~20 s under TCG on a 2-core host, ~1 s under KVM. */
export const PARENT_BOOT_TIMEOUT_MS = { tcg: 240_000, kvm: 60_000 } as const;
/** Warm-up code (e.g. `import numpy`) takes seconds under TCG; a template that needs more can say so later. */
export const WARMUP_TIMEOUT_MS = 300_000;

export interface ProgressEvent {
  step: "image" | "accelerator" | "boot" | "warmup" | "save" | "commit";
  message: string;
}

export interface CreateSnapshotOptions {
  tag: string;
  /** Template name or path to a template file; defaults to the tag. */
  template?: string;
  replace?: boolean;
  onProgress?: (event: ProgressEvent) => void;
  signal?: AbortSignal;
}

export interface CreatedSnapshot {
  tag: string;
  dir: string;
  manifest: SnapshotManifest;
  image: BuiltImage;
}

export async function createSnapshot(
  paths: ForkdPaths,
  options: CreateSnapshotOptions,
): Promise<CreatedSnapshot> {
  const tag = assertTag(options.tag);
  const progress = options.onProgress ?? (() => {});
  const signal = options.signal;
  const template = await loadTemplate(options.template ?? tag);
  const store = new SnapshotStore(paths.snapshots);
  await store.sweepStale();

  progress({ step: "image", message: `image for template ${template.name}` });
  const image = await buildImage(template, {
    signal,
    onProgress: (e) => progress({ step: "image", message: e.message }),
  });

  progress({ step: "accelerator", message: "choosing accelerator" });
  const accel = await chooseAccelerator(paths, image, { signal });
  progress({ step: "accelerator", message: `accelerator ${accel.accel} (${accel.reason})` });

  const writer = await store.beginWrite(tag, { replace: options.replace });
  const runDir = path.join(paths.run, `parent-${newSandboxId()}`);
  let vm: VmHandle | undefined;
  let agent: AgentClient | undefined;
  try {
    const shape: MachineShape = {
      accel: accel.accel,
      cpuModel: cpuModelFor(accel.accel),
      memoryMiB: template.memoryMib,
      vcpus: template.vcpus,
      kernel: image.kernel,
      initrd: image.initrd,
      kernelCmdline: image.kernelCmdline,
    };
    await createOverlay({
      backing: image.rootfs,
      backingFormat: "raw",
      overlay: writer.file(SNAPSHOT_FILES.disk),
    });

    progress({ step: "boot", message: `booting parent (${shape.memoryMiB} MiB, ${accel.accel})` });
    const bootStarted = performance.now();
    const bootSignal = deadlineSignal(PARENT_BOOT_TIMEOUT_MS[accel.accel], signal);
    vm = await launchVm(
      machineSpec(shape, {
        runDir,
        memoryFile: writer.file(SNAPSHOT_FILES.memory),
        shared: true,
        disk: writer.file(SNAPSHOT_FILES.disk),
      }),
      { runDir, signal: bootSignal },
    );
    const booted = vm;
    agent = new AgentClient(await booted.agentConnection);
    const hello = await raceExit(booted, agent.waitHello({ signal: bootSignal }), "parent boot");
    const bootMs = performance.now() - bootStarted;
    progress({
      step: "boot",
      message: `agent ${hello.agent_version} ready after ${(bootMs / 1000).toFixed(1)} s`,
    });

    let warmupMs = 0;
    if (template.warmup !== undefined) {
      progress({ step: "warmup", message: "running warm-up" });
      const started = performance.now();
      const result = await raceExit(
        booted,
        agent.warmup(template.warmup, { timeoutMs: WARMUP_TIMEOUT_MS, signal }),
        "warm-up",
      );
      if (result.error) {
        throw new ForkdError(
          "unprocessable",
          `template ${template.name}: warm-up failed: ${result.error.type}: ${result.error.message}\n${result.error.traceback}`,
        );
      }
      warmupMs = performance.now() - started;
      progress({ step: "warmup", message: `warm after ${(warmupMs / 1000).toFixed(1)} s` });
    }

    progress({ step: "save", message: "pausing parent and saving device state" });
    const qmp = await booted.qmp({ signal });
    const saved = await saveDeviceState(qmp, writer.file(SNAPSHOT_FILES.deviceState), { signal });
    agent.close();
    await booted.kill({ graceMs: 2000 });

    progress({ step: "commit", message: "hashing and committing snapshot" });
    const version = await qemuVersion();
    const manifest = await writer.commit(
      {
        template: { name: template.name, interpreter: template.interpreter },
        image: { hash: image.hash, rootfs: image.rootfs, kernel: image.kernel, initrd: image.initrd },
        machine: {
          accel: shape.accel,
          cpu: shape.cpuModel,
          memoryMiB: shape.memoryMiB,
          vcpus: shape.vcpus,
          cmdline: shape.kernelCmdline,
          qemuVersion: version.version,
        },
        timings: { bootMs: Math.round(bootMs), warmupMs: Math.round(warmupMs), saveMs: round1(saved.ms) },
        parent: null,
      },
      [SNAPSHOT_FILES.memory, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk],
      signal,
    );
    return { tag, dir: store.dirOf(tag), manifest, image };
  } catch (err) {
    if (vm) {
      const tail = await vm.consoleTail(2000).catch(() => "");
      await vm.kill({ graceMs: 0 }).catch(() => {});
      if (tail && !(err instanceof ForkdError && err.code === "unprocessable")) {
        throw new ForkdError(
          err instanceof ForkdError ? err.code : "internal",
          `${errorMessage(err)}\n--- guest console (last lines) ---\n${tail}`,
          { cause: err },
        );
      }
    }
    throw err;
  } finally {
    agent?.close();
    await writer.abort();
    await rm(runDir, { recursive: true, force: true });
  }
}

/** Rejects with the QEMU exit (and its stderr) if the VM dies while `work` is pending. */
export async function raceExit<T>(vm: VmHandle, work: Promise<T>, what: string): Promise<T> {
  const died = vm.exited.then((exit) => {
    const output = vm.process.outputTail().trim();
    throw new ForkdError("unavailable", `${what}: QEMU ${describeExit(exit)}${output ? `: ${output}` : ""}`);
  });
  return Promise.race([work, died]);
}

function round1(n: number): number {
  return Math.round(n * 10) / 10;
}
