/** Snapshots: their info, creation, packs and compaction. Part of the REST API's wire contract (src/api/schemas.ts). */
import { type Static, Type } from "@sinclair/typebox";
import { MAX_PATH_CHARS, TAG_PATTERN } from "../../common/limits.js";
import { Nullable, Tag } from "./common.js";

// Snapshots

/** An egress policy as the daemon reports it (every field present). */
export const EgressPolicyOut = Type.Object({
  egress: Type.Union([Type.Literal("allow"), Type.Literal("deny")]),
  allow_out: Type.Array(Type.String()),
  deny_out: Type.Array(Type.String()),
});

export const SnapshotInfoWire = Type.Object(
  {
    tag: Type.String(),
    dir: Type.String({ description: "Where the snapshot lives on the daemon's host." }),
    created_at_unix: Type.Integer(),
    status: Type.Union([Type.Literal("writing"), Type.Literal("ready"), Type.Literal("failed")]),
    bootable: Type.Boolean(),
    template: Nullable(Type.String()),
    accelerator: Nullable(Type.Union([Type.Literal("kvm"), Type.Literal("tcg")])),
    memory_mib: Nullable(Type.Integer()),
    parent_tag: Nullable(Type.String()),
    bytes: Type.Integer({ description: "Bytes the snapshot's files take (logical sizes)." }),
    error: Nullable(Type.String()),
    vcpus: Nullable(Type.Integer({ description: "vCPUs of the machine its children run on." })),
    source_sandbox: Nullable(Type.String({ description: "The sandbox it was BRANCHed from." })),
    aliases: Type.Array(Type.String(), { description: "Template aliases naming it." }),
    ephemeral: Type.Boolean({
      description: "Made by the daemon for a fork (or superseded under its alias): deleted once unused.",
    }),
    owner: Nullable(
      Type.String({ description: "The tenant that owns it (docs/security.md#tenancy); null: an admin's." }),
    ),
    origin: Nullable(
      Type.Union(
        [Type.Literal("template"), Type.Literal("branch"), Type.Literal("compact"), Type.Literal("pause")],
        {
          description:
            "Booted from a template, BRANCHed from a sandbox, compacted from a chain, or a sandbox's paused " +
            "state; null if not on disk.",
        },
      ),
    ),
    branch_mode: Nullable(
      Type.Union([Type.Literal("full"), Type.Literal("diff"), Type.Literal("live")], {
        description: "A branch's mode: full stands alone, diff and live are layers on parent_tag.",
      }),
    ),
    disk_bytes: Type.Integer({
      description:
        "Bytes its own files occupy on disk (allocated blocks: sparse RAM images count what is stored).",
    }),
    egress_default: Type.Union([EgressPolicyOut, Type.Null()], {
      description:
        "The egress policy its sandboxes get when a spawn names none, from its template's [egress] (fields a " +
        "spawn's policy leaves out come from it too); null: the daemon's --egress.",
    }),
  },
  { description: "SnapshotInfo (v0.5 fields tag, dir, created_at_unix, status, bootable)." },
);
export type SnapshotInfoWire = Static<typeof SnapshotInfoWire>;

export const ByteCounts = {
  logical_bytes: Type.Integer({ description: "RAM size (memory) or qcow2 virtual size (disk)." }),
  physical_bytes: Type.Integer({ description: "Bytes the file occupies on disk (st_blocks * 512)." }),
};

export const LayerUsageWire = Type.Object(
  {
    tag: Type.String(),
    origin: Type.String({ description: "template, branch or compact" }),
    memory: Type.Object({
      format: Type.Union([Type.Literal("flat"), Type.Literal("layer")]),
      pages: Type.Integer({ description: "Pages stored in this layer's memory file." }),
      ...ByteCounts,
    }),
    disk: Type.Object({
      ...ByteCounts,
      backing: Nullable(Type.String({ description: "The layer's backing file, as recorded (relative)." })),
    }),
    vmstate_bytes: Type.Integer(),
  },
  { description: "One layer of a snapshot chain and what it takes on disk." },
);

export const SnapshotDetailWire = Type.Composite(
  [
    SnapshotInfoWire,
    Type.Object({
      chain_depth: Type.Integer({ description: "0 for a base snapshot, 1 for one parent, ..." }),
      parent_content_hash: Nullable(
        Type.String({ description: "sha256 of the parent's manifest, as this snapshot recorded it." }),
      ),
      ancestors: Type.Array(Type.String(), { description: "Tags from the chain root to the parent." }),
      dependents: Type.Array(Type.String(), { description: "Snapshots whose parent_tag is this one." }),
      all_dependents: Type.Array(Type.String(), {
        description: "Every snapshot depending on this one, directly or not (parents before children).",
      }),
      layers: Type.Array(LayerUsageWire, { description: "Root first, this snapshot last." }),
      chain_bytes: Type.Object(
        { memory_physical: Type.Integer(), disk_physical: Type.Integer(), vmstate: Type.Integer() },
        { description: "Bytes on disk a child of this snapshot reads from, over the whole chain." },
      ),
      memory_logical_bytes: Type.Integer({ description: "v0.5 name: this snapshot's RAM size." }),
      memory_physical_bytes: Type.Integer({ description: "v0.5 name: its memory file's bytes on disk." }),
      vmstate_bytes: Type.Integer(),
      chain_error: Nullable(
        Type.String({ description: "Why the chain cannot be restored (missing/changed parent), or null." }),
      ),
    }),
  ],
  { description: "GET /v1/snapshots/:tag/info (v0.5's SnapshotInfoDetail plus per-layer bytes)." },
);

export const CreateSnapshotBody = Type.Object(
  {
    tag: Tag,
    template: Type.Optional(
      Type.String({ pattern: TAG_PATTERN, description: "Template name (default: the tag)." }),
    ),
    kernel: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: MAX_PATH_CHARS,
        description:
          "forkd v0.5 field: a kernel on the daemon's host. Accepted when kernel and rootfs are the vmlinuz and " +
          "rootfs.ext4 of one built forkd image in an allowed image directory (the image cache, plus " +
          "`forkd daemon --allow-image-dir`); the snapshot is then made from that image. Anything else is 400.",
      }),
    ),
    rootfs: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: MAX_PATH_CHARS,
        description:
          "forkd v0.5 field: the root filesystem next to `kernel` (see there). Not without kernel.",
      }),
    ),
    rw: Type.Optional(
      Type.Boolean({ description: "forkd v0.5 field; ignored (the image's root is mounted read-write)." }),
    ),
    tap: Type.Optional(Nullable(Type.String({ description: "forkd v0.5 field; 501 when given." }))),
    boot_wait_secs: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 60,
        description: "forkd v0.5 field; ignored (readiness is signalled).",
      }),
    ),
  },
  { additionalProperties: false },
);
export type CreateSnapshotBody = Static<typeof CreateSnapshotBody>;

export const DeleteSnapshotQuery = Type.Object(
  {
    cascade: Type.Optional(
      Type.Boolean({ description: "Delete every snapshot depending on this one too (leaves first)." }),
    ),
    force: Type.Optional(
      Type.Boolean({ description: "Delete it and leave its dependents orphaned (unbootable, they say so)." }),
    ),
  },
  { additionalProperties: false },
);

/**
 * Largest pack `POST /v1/snapshots/unpack` receives (a chain with its guest image; controller/snapshots/unpack.ts
 * bounds each file).
 */
export const MAX_PACK_UPLOAD_BYTES = 256 * 1024 ** 3;

export const PackQuery = Type.Object(
  {
    without_image: Type.Optional(
      Type.Boolean({
        description: "Leave the guest image out (the pack then unpacks only where that image build exists).",
      }),
    ),
    level: Type.Optional(Type.Integer({ minimum: 1, maximum: 19, description: "zstd level (default 3)." })),
  },
  { additionalProperties: false },
);

export const UnpackQuery = Type.Object(
  {
    tag: Type.Optional(
      Type.String({
        pattern: TAG_PATTERN,
        description: "Install the head under this tag (ancestors keep theirs).",
      }),
    ),
    force: Type.Optional(
      Type.Boolean({
        description: "Replace existing snapshots of the same tags that differ from the packed ones.",
      }),
    ),
  },
  { additionalProperties: false },
);

export const UnpackResultWire = Type.Object({
  head: Type.String(),
  chain: Type.Array(Type.String(), { description: "Root first, as installed." }),
  installed: Type.Array(Type.String()),
  reused: Type.Array(Type.String(), { description: "Layers already present, identical, and kept." }),
  replaced: Type.Array(Type.String(), { description: "Existing snapshots replaced (force)." }),
  orphaned: Type.Array(Type.String(), { description: "Local snapshots left unbootable by a replacement." }),
  image: Type.Union([Type.Literal("installed"), Type.Literal("present")]),
  content_bytes: Type.Integer(),
  ms: Type.Number(),
});

export const CompactSnapshotBody = Type.Object(
  {
    to: Type.String({ pattern: TAG_PATTERN, description: "Tag of the new flat snapshot (must not exist)." }),
  },
  { additionalProperties: false },
);
export type CompactSnapshotBody = Static<typeof CompactSnapshotBody>;
