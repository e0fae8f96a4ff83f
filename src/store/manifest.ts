/** The snapshot manifest: the one file that says what a snapshot is and lets every other file be verified. */
import { type Static, Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { ForkdError } from "../common/errors.js";
import {
  ENV_NAME_PATTERN,
  GUEST_USER_NAME_PATTERN,
  MAX_GUEST_CWD_CHARS,
  MAX_READY_INTERVAL_MS,
  MAX_READY_TIMEOUT_S,
  MAX_TEMPLATE_COMMAND_ARGV,
  MAX_TEMPLATE_COMMAND_CHARS,
  MAX_TEMPLATE_COMMAND_ENV,
  MAX_TEMPLATE_ENV_VALUE_CHARS,
  MIN_READY_INTERVAL_MS,
  MIN_READY_TIMEOUT_S,
} from "../common/limits.js";

export const MANIFEST_FORMAT = 2;
export const MANIFEST_FILE = "manifest.json";

const FileEntry = Type.Object({
  size: Type.Integer({ minimum: 0 }),
  sha256: Type.String({ pattern: "^[0-9a-f]{64}$" }),
});

/** A command as a snapshot's template runs it through the guest agent: argv, and who, where, with what env. */
const guestCommandFields = {
  argv: Type.Array(Type.String({ maxLength: MAX_TEMPLATE_COMMAND_CHARS }), {
    minItems: 1,
    maxItems: MAX_TEMPLATE_COMMAND_ARGV,
  }),
  /** Absent: root. Already resolved against the image's default user when the snapshot was made. */
  user: Type.Optional(Type.String({ pattern: GUEST_USER_NAME_PATTERN })),
  cwd: Type.Optional(Type.String({ pattern: "^/", maxLength: MAX_GUEST_CWD_CHARS })),
  env: Type.Record(
    Type.String({ pattern: ENV_NAME_PATTERN }),
    Type.String({ maxLength: MAX_TEMPLATE_ENV_VALUE_CHARS }),
    { maxProperties: MAX_TEMPLATE_COMMAND_ENV, additionalProperties: false },
  ),
};

export const ManifestStartCommandSchema = Type.Object(guestCommandFields, { additionalProperties: false });

export const ManifestReadyCheckSchema = Type.Object(
  {
    ...guestCommandFields,
    /** How long the check may take to succeed, and the pause between two attempts. */
    timeoutMs: Type.Integer({ minimum: MIN_READY_TIMEOUT_S * 1000, maximum: MAX_READY_TIMEOUT_S * 1000 }),
    intervalMs: Type.Integer({ minimum: MIN_READY_INTERVAL_MS, maximum: MAX_READY_INTERVAL_MS }),
  },
  { additionalProperties: false },
);

export type ManifestStartCommand = Static<typeof ManifestStartCommandSchema>;
export type ManifestReadyCheck = Static<typeof ManifestReadyCheckSchema>;

export const SnapshotManifestSchema = Type.Object({
  format: Type.Literal(MANIFEST_FORMAT),
  tag: Type.String(),
  createdAtUnix: Type.Integer(),
  template: Type.Object({
    name: Type.String(),
    interpreter: Type.String(),
    /**
     * The template's egress default (`[egress]`, canonical form): what a sandbox of this snapshot (or of any
     * snapshot made from it) gets when its spawn names no policy. Absent: the daemon's `--egress`.
     */
    egress: Type.Optional(
      Type.Object({
        default: Type.Union([Type.Literal("allow"), Type.Literal("deny")]),
        allowOut: Type.Array(Type.String()),
        denyOut: Type.Array(Type.String()),
      }),
    ),
    /**
     * The template's `start` command and `ready` check, as they ran in the parent before it was saved. A restore
     * keeps the started process; a cold boot (a filesystem-only pause's resume) runs them again. Absent: none (and
     * in manifests written before forkd recorded them).
     */
    start: Type.Optional(ManifestStartCommandSchema),
    ready: Type.Optional(ManifestReadyCheckSchema),
  }),
  image: Type.Object({
    hash: Type.String(),
    /** Changes when an image is rebuilt in place (`image build --force`): the disk layers would no longer fit. */
    buildId: Type.String(),
    rootfs: Type.String(),
    kernel: Type.String(),
    initrd: Type.String(),
  }),
  machine: Type.Object({
    accel: Type.Union([Type.Literal("kvm"), Type.Literal("tcg")]),
    cpu: Type.String(),
    memoryMiB: Type.Integer({ minimum: 16 }),
    vcpus: Type.Integer({ minimum: 1 }),
    cmdline: Type.String(),
    tscKhz: Type.Union([Type.Integer(), Type.Null()]),
    /** vmm's restoreCompatibilityKey of the parent: a child whose machine differs cannot load the state. */
    compatKey: Type.String(),
    /**
     * The parent's NIC (absent or null: none). Every child gets the same NIC: `vnetHdr` says whether it had
     * offloads (a tap opened with IFF_VNET_HDR), which a child's tap must match.
     */
    nic: Type.Optional(
      Type.Union([Type.Null(), Type.Object({ mac: Type.String(), vnetHdr: Type.Boolean() })]),
    ),
    qemuVersion: Type.String(),
  }),
  /**
   * How guest RAM is stored: `flat` = memory.bin, a whole RAM image children map directly; `layer` =
   * memory.layer, only the pages changed relative to the parent (see memory-layer.ts).
   */
  memory: Type.Object({
    format: Type.Union([Type.Literal("flat"), Type.Literal("layer")]),
    ramBytes: Type.Integer({ minimum: 0 }),
    /** Pages stored in this snapshot's own memory file. */
    pages: Type.Integer({ minimum: 0 }),
  }),
  /**
   * How the snapshot came to be: booted from a template, BRANCHed from a running sandbox, compacted from a chain
   * (then `compactedFrom` names the chain's head as it was), or written by a pause of `sourceSandbox` (its state
   * while paused).
   */
  origin: Type.Object({
    kind: Type.Union([
      Type.Literal("template"),
      Type.Literal("branch"),
      Type.Literal("compact"),
      Type.Literal("pause"),
    ]),
    mode: Type.Union([Type.Null(), Type.Literal("full"), Type.Literal("diff"), Type.Literal("live")]),
    sourceSandbox: Type.Union([Type.Null(), Type.String()]),
    pauseMs: Type.Union([Type.Null(), Type.Number()]),
    compactedFrom: Type.Optional(Type.Object({ tag: Type.String(), manifestSha256: Type.String() })),
  }),
  /** Content hashes of every data file, computed when the snapshot was written. */
  files: Type.Record(Type.String(), FileEntry),
  timings: Type.Object({ bootMs: Type.Number(), warmupMs: Type.Number(), saveMs: Type.Number() }),
  /** Set for layered snapshots; null for a snapshot taken from a freshly booted parent. */
  parent: Type.Union([Type.Null(), Type.Object({ tag: Type.String(), manifestSha256: Type.String() })]),
});

export type SnapshotManifest = Static<typeof SnapshotManifestSchema>;

export function parseManifest(text: string, where: string): SnapshotManifest {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new ForkdError("unprocessable", `${where}: manifest is not valid JSON`, { cause: err });
  }
  if (!Value.Check(SnapshotManifestSchema, raw)) {
    const first = Value.Errors(SnapshotManifestSchema, raw).First();
    throw new ForkdError(
      "unprocessable",
      `${where}: manifest is invalid at ${first?.path || "/"}: ${first?.message ?? "unknown error"}`,
    );
  }
  return raw;
}
