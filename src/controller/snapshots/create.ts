/**
 * Template -> warm snapshot. The parent boots with its RAM in a file inside the snapshot's staging directory,
 * so saving it costs only the device state (milliseconds): the guest already wrote its memory into the file.
 */

import { lchown, rm, symlink } from "node:fs/promises";
import path from "node:path";
import { crashPoint } from "../../common/crash-points.js";
import { invalidArgument } from "../../common/errors.js";
import { assertTag } from "../../common/names.js";
import type { ForkdPaths } from "../../common/paths.js";
import { type BuiltImage, buildImage, loadTemplate } from "../../image/index.js";
import type { ConfinementConfig } from "../../isolation/confinement.js";
import { canonicalEntries, type EgressPolicy, parseEgressPolicy } from "../../net/policy.js";
import type { SnapshotManifest } from "../../store/manifest.js";
import { SnapshotStore, type SnapshotWriter } from "../../store/snapshot-store.js";
import { restoreCompatibilityKey } from "../../vmm/qemu-args.js";
import { createOverlay, qemuVersion } from "../../vmm/qemu-tools.js";
import { saveDeviceState } from "../../vmm/snapshot.js";
import { killAndWait, processesMentioning } from "../host/processes.js";
import { chooseAccelerator } from "../machines/accelerator.js";
import { type BootedVm, type BootTemplate, bootWarmVm } from "../machines/boot.js";
import { newSandboxId } from "../machines/ids.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";
import { trustFreshImage, verifyImage } from "../machines/restore-plan.js";
import { guestCommandsOf } from "../machines/start-ready.js";

export interface ProgressEvent {
  step: "image" | "accelerator" | "boot" | "ready" | "warmup" | "save" | "commit";
  message: string;
  /** An image event of a format-2 build's base (0) or step (1..n). */
  buildStep?: number;
}

/** Host memory a parent's QEMU is assumed to need beyond the guest's RAM, for memory admission. */
const PARENT_QEMU_OVERHEAD_MIB = 64;
/** Disk a parent's own layer is assumed to grow by during boot and warm-up, for disk admission. */
const PARENT_DISK_SLACK_MIB = 256;

export interface CreateSnapshotOptions {
  tag: string;
  /** Template name or path to a template file (with templateFiles); defaults to the tag. */
  template?: string;
  /**
   * An image already built (e.g. the one a forkd v0.5 client named by its kernel and rootfs files): boot it with
   * the template it was built from, without loading or building anything. Excludes `template`.
   */
  image?: BuiltImage;
  /** Whether `template` may name a file (the CLI: yes; the daemon, for API callers: no). */
  templateFiles?: boolean;
  replace?: boolean;
  /** Build the image again: no cached image or build step (`forkd image build --force`). */
  force?: boolean;
  /** Give the parent (and so every child) a NIC; default: the template's `network`. */
  network?: boolean;
  /** How the parent VM is confined (default: this process's). */
  confinement?: ConfinementConfig;
  /**
   * Admits the parent VM's memory (the template's RAM plus QEMU's own) before it boots, or throws (the daemon's
   * admission control); what it returns is released when the parent is gone.
   */
  admitBoot?: (memoryMiB: number) => { release(): void };
  onProgress?: (event: ProgressEvent) => void;
  signal?: AbortSignal;
}

export interface CreatedSnapshot {
  tag: string;
  dir: string;
  manifest: SnapshotManifest;
  image: BuiltImage;
}

async function imageToBoot(
  options: CreateSnapshotOptions,
  tag: string,
  progress: (event: ProgressEvent) => void,
): Promise<{ template: BootTemplate; image: BuiltImage }> {
  if (options.image) {
    if (options.template !== undefined) throw invalidArgument("give a template or an image, not both");
    progress({
      step: "image",
      message: `image ${options.image.hash.slice(0, 12)} (${options.image.template.name})`,
    });
    return { template: options.image.template, image: options.image };
  }
  const template = await loadTemplate(options.template ?? tag, { allowFiles: options.templateFiles });
  // Checked before the build: a bad entry should not cost minutes of image build first.
  templateEgressPolicy(template);
  progress({ step: "image", message: `image for template ${template.name}` });
  const image = await buildImage(template, {
    signal: options.signal,
    force: options.force,
    onProgress: (e) =>
      progress({
        step: "image",
        message: e.message,
        ...(e.buildStep === undefined ? {} : { buildStep: e.buildStep }),
      }),
  });
  return { template, image };
}

export async function createSnapshot(
  paths: ForkdPaths,
  options: CreateSnapshotOptions,
): Promise<CreatedSnapshot> {
  const tag = assertTag(options.tag);
  const progress = options.onProgress ?? (() => {});
  const signal = options.signal;
  const store = new SnapshotStore(paths.snapshots);
  await sweepStaleSnapshotFiles(store);
  const { template, image } = await imageToBoot(options, tag, progress);
  // A fresh build just hashed its files; a cached one is checked against those hashes before a VM boots on it.
  if (image.cached) await verifyImage(paths, { ...image, buildId: image.manifest.buildId });
  else await trustFreshImage(paths, image);

  progress({ step: "accelerator", message: "choosing accelerator" });
  const accel = await chooseAccelerator(paths, image, { signal, confinement: options.confinement });
  progress({ step: "accelerator", message: `accelerator ${accel.accel} (${accel.reason})` });

  // The parent's RAM file (up to its whole size) and what boot and warm-up write to its disk layer.
  const writer = await store.beginWrite(tag, {
    replace: options.replace,
    expectedBytes: (template.memoryMib + PARENT_DISK_SLACK_MIB) * 2 ** 20,
  });
  const runDir = path.join(paths.run, `parent-${newSandboxId()}`);
  let booted: BootedVm | undefined;
  let admitted: { release(): void } | undefined;
  crashPoint("snapshot.staged");
  try {
    admitted = options.admitBoot?.(template.memoryMib + PARENT_QEMU_OVERHEAD_MIB);
    await symlink(image.rootfs, writer.file(SNAPSHOT_FILES.baseDisk));
    await createOverlay({
      backing: SNAPSHOT_FILES.baseDisk,
      backingFormat: "raw",
      overlay: writer.file(SNAPSHOT_FILES.disk),
    });
    booted = await bootWarmVm({
      template,
      image,
      accel,
      runDir,
      memoryFile: writer.file(SNAPSHOT_FILES.memory),
      disk: writer.file(SNAPSHOT_FILES.disk),
      diskBacking: [writer.file(SNAPSHOT_FILES.baseDisk)],
      network: options.network,
      confinement: options.confinement,
      signal,
      onProgress: (step, message) => progress({ step, message }),
    });

    crashPoint("snapshot.booted");
    progress({ step: "save", message: "pausing parent and saving device state" });
    const saveMs = await saveParent(booted, writer, runDir, signal);
    progress({ step: "commit", message: "hashing and committing snapshot" });
    const manifest = await writer.commit(
      parentManifest(template, image, booted, { saveMs, qemu: (await qemuVersion()).version }),
      [SNAPSHOT_FILES.memory, SNAPSHOT_FILES.deviceState, SNAPSHOT_FILES.disk],
      signal,
    );
    return { tag, dir: store.dirOf(tag), manifest, image };
  } finally {
    if (booted) {
      booted.agent.close();
      await booted.vm.kill({ graceMs: 0 }).catch(() => {});
    }
    admitted?.release();
    await writer.abort();
    await rm(runDir, { recursive: true, force: true });
  }
}

/**
 * Pauses the booted parent, saves its device state into the snapshot and kills it: it must never run again, its
 * RAM file is now the snapshot's memory. Returns how long the save took.
 */
async function saveParent(
  booted: BootedVm,
  writer: SnapshotWriter,
  runDir: string,
  signal: AbortSignal | undefined,
): Promise<number> {
  const qmp = await booted.vm.qmp({ signal });
  const saved = await saveDeviceState(qmp, writer.file(SNAPSHOT_FILES.deviceState), {
    signal,
    // A confined parent sees only its run directory: it writes the state there first.
    drop: booted.owner ? { dir: runDir, owner: booted.owner } : undefined,
  });
  crashPoint("snapshot.saved");
  booted.agent.close();
  // The parent must never run again: its RAM file is now the snapshot's memory.
  await booted.vm.kill({ graceMs: 2000 });
  // The parent's uid wrote them; from now on they are the snapshot's, and root's.
  for (const name of [SNAPSHOT_FILES.memory, SNAPSHOT_FILES.disk]) await lchown(writer.file(name), 0, 0);
  return saved.ms;
}

/** The manifest of a snapshot booted from `template`: its image, the machine its children must match, timings. */
function parentManifest(
  template: BootTemplate,
  image: BuiltImage,
  booted: BootedVm,
  facts: { saveMs: number; qemu: string },
): Omit<SnapshotManifest, "format" | "tag" | "files" | "createdAtUnix"> {
  const { shape } = booted;
  return {
    template: {
      name: template.name,
      interpreter: template.interpreter,
      ...(template.egress ? { egress: templateEgressPolicy(template) } : {}),
      // What ran before the save, so a cold boot of a sandbox of it can run them again.
      ...guestCommandsOf(template, image),
    },
    image: {
      hash: image.hash,
      buildId: image.manifest.buildId,
      rootfs: image.rootfs,
      kernel: image.kernel,
      initrd: image.initrd,
    },
    machine: {
      accel: shape.accel,
      cpu: shape.cpuModel,
      memoryMiB: shape.memoryMiB,
      vcpus: shape.vcpus,
      cmdline: shape.kernelCmdline,
      tscKhz: shape.tscKhz ?? null,
      compatKey: restoreCompatibilityKey(booted.vm.spec),
      nic: shape.nic ?? null,
      qemuVersion: facts.qemu,
    },
    timings: {
      bootMs: Math.round(booted.bootMs),
      warmupMs: Math.round(booted.warmupMs),
      saveMs: Math.round(facts.saveMs * 10) / 10,
    },
    parent: null,
    memory: { format: "flat", ramBytes: shape.memoryMiB * 1024 * 1024, pages: shape.memoryMiB * 256 },
    origin: { kind: "template", mode: null, sourceSandbox: null, pauseMs: null },
  };
}

/**
 * A template's `[egress]` as the policy its snapshot records (undefined: none), every entry checked with the
 * same rules as a spawn's policy and named by its TOML field in errors.
 */
export function templateEgressPolicy(template: BootTemplate): EgressPolicy | undefined {
  if (!template.egress) return undefined;
  const field = `${template.source ?? template.name}: egress`;
  return parseEgressPolicy(
    {
      default: template.egress.default,
      allowOut: canonicalEntries(template.egress.allowOut, `${field}.allow_out`),
      denyOut: canonicalEntries(template.egress.denyOut, `${field}.deny_out`),
    },
    field,
  );
}

/**
 * Removes what dead writers left in the snapshot store. A parent VM of a snapshot whose writer died (SIGKILL
 * reaches no cleanup) still maps its staging directory's memory file: it is stopped before the files go.
 */
export async function sweepStaleSnapshotFiles(store: SnapshotStore): Promise<string[]> {
  return store.sweepStale(async (dir) => {
    for (const identity of await processesMentioning(dir)) await killAndWait(identity);
  });
}
