/**
 * The console's fork tree, as a pure function of the daemon's snapshots and sandboxes (used by the page; kept
 * here, free of DOM and Node, so node --test checks it). Templates at the top; under each, its root snapshots;
 * under a snapshot, the layers on it (diff/live branches whose parent it is) and the sandboxes restored from it;
 * under a sandbox, the snapshots BRANCHed from it while it runs. Every snapshot and sandbox appears exactly once,
 * whatever the input (a missing parent, a source that is gone, or a cycle puts a snapshot at its template's top).
 */
import type { SandboxWire, SnapshotWire } from "./protocol.js";

export interface SnapshotNode {
  kind: "snapshot";
  snapshot: SnapshotWire;
  /** Layers on this snapshot and the sandboxes restored from it, snapshots first. */
  children: TreeNode[];
  /** Sandboxes anywhere below (restored from it or from a snapshot below it). */
  sandboxCount: number;
}

export interface SandboxNode {
  kind: "sandbox";
  sandbox: SandboxWire;
  /** Snapshots branched from it while it runs. */
  children: SnapshotNode[];
}

export type TreeNode = SnapshotNode | SandboxNode;

export interface TemplateGroup {
  /** The template name, or null for snapshots whose template is not known (being written, failed). */
  template: string | null;
  roots: SnapshotNode[];
  sandboxCount: number;
}

/** Snapshot kind for its badge: how it was made and whether it is a layer. */
export function snapshotKind(
  s: SnapshotWire,
): "template" | "full" | "diff" | "live" | "compact" | "writing" | "failed" {
  if (s.status === "writing") return "writing";
  if (s.status === "failed") return "failed";
  if (s.origin === "branch") return s.branch_mode ?? "full";
  if (s.origin === "compact") return "compact";
  return "template";
}

export function buildTree(
  snapshots: readonly SnapshotWire[],
  sandboxes: readonly SandboxWire[],
): TemplateGroup[] {
  const parentOf = placements(snapshots, sandboxes);
  const snapshotNodes = new Map<string, SnapshotNode>(
    snapshots.map((s) => [s.tag, { kind: "snapshot", snapshot: s, children: [], sandboxCount: 0 }]),
  );
  const sandboxNodes = new Map<string, SandboxNode>(
    sandboxes.map((sb) => [sb.id, { kind: "sandbox", sandbox: sb, children: [] }]),
  );
  const tops: SnapshotNode[] = [];
  for (const s of snapshots) {
    const node = snapshotNodes.get(s.tag) as SnapshotNode;
    const at = parentOf.get(s.tag) ?? null;
    if (at === null) tops.push(node);
    else if ("snapshot" in at) snapshotNodes.get(at.snapshot)?.children.push(node);
    else sandboxNodes.get(at.sandbox)?.children.push(node);
  }
  const orphans: SandboxNode[] = [];
  for (const sb of sandboxes) {
    const node = sandboxNodes.get(sb.id) as SandboxNode;
    const parent = snapshotNodes.get(sb.snapshot_tag);
    if (parent) parent.children.push(node);
    else orphans.push(node);
  }
  for (const node of snapshotNodes.values()) sortChildren(node);
  for (const node of sandboxNodes.values()) node.children.sort(bySnapshotAge);
  for (const top of tops) countSandboxes(top);
  return groupByTemplate(tops, orphans);
}

type Placement = { snapshot: string } | { sandbox: string } | null;

/**
 * Where each snapshot hangs: under its source sandbox while that runs (if the snapshot is that sandbox's own
 * layer or stands alone), else under its parent, else at the top (null).
 */
function placements(
  snapshots: readonly SnapshotWire[],
  sandboxes: readonly SandboxWire[],
): Map<string, Placement> {
  const byTag = new Map(snapshots.map((s) => [s.tag, s]));
  const liveSandbox = new Map(
    sandboxes.filter((sb) => sb.status !== "dead").map((sb) => [sb.id, sb] as const),
  );
  const parentOf = new Map<string, Placement>();
  for (const s of snapshots) {
    const source = s.source_sandbox === null ? undefined : liveSandbox.get(s.source_sandbox);
    const parentKnown = s.parent_tag !== null && byTag.has(s.parent_tag);
    const sourceLine = source === undefined ? undefined : sandboxLine(source, byTag);
    if (source && (s.parent_tag === null || sourceLine?.has(s.parent_tag))) {
      // A diff branch whose parent is itself a branch of the same sandbox nests under that branch instead.
      const parentIsSourceBranch =
        s.parent_tag !== null &&
        byTag.get(s.parent_tag)?.source_sandbox === source.id &&
        s.parent_tag !== source.snapshot_tag;
      parentOf.set(
        s.tag,
        parentIsSourceBranch ? { snapshot: s.parent_tag as string } : { sandbox: source.id },
      );
    } else if (parentKnown) parentOf.set(s.tag, { snapshot: s.parent_tag as string });
    else parentOf.set(s.tag, null);
  }
  breakCycles(snapshots, sandboxes, parentOf);
  return parentOf;
}

/** The top snapshots by template (oldest first), and the sandboxes whose snapshot is gone under "no template". */
function groupByTemplate(tops: SnapshotNode[], orphans: readonly SandboxNode[]): TemplateGroup[] {
  const groups = new Map<string | null, TemplateGroup>();
  for (const top of tops.sort(bySnapshotAge)) {
    const template = top.snapshot.template;
    let group = groups.get(template);
    if (!group) {
      group = { template, roots: [], sandboxCount: 0 };
      groups.set(template, group);
    }
    group.roots.push(top);
    group.sandboxCount += top.sandboxCount;
  }
  if (orphans.length > 0) {
    // Sandboxes whose snapshot is gone from the list (deleted with --force): shown, not lost.
    const missing = new Map<string, SnapshotNode>();
    for (const orphan of orphans) {
      const tag = orphan.sandbox.snapshot_tag;
      let node = missing.get(tag);
      if (!node) {
        node = { kind: "snapshot", snapshot: missingSnapshot(tag), children: [], sandboxCount: 0 };
        missing.set(tag, node);
      }
      node.children.push(orphan);
      node.sandboxCount++;
    }
    const group = groups.get(null) ?? { template: null, roots: [], sandboxCount: 0 };
    group.roots.push(...missing.values());
    group.sandboxCount += orphans.length;
    groups.set(null, group);
  }
  return [...groups.values()].sort((a, b) =>
    a.template === null ? 1 : b.template === null ? -1 : a.template.localeCompare(b.template),
  );
}

/** The snapshots a sandbox runs on: its own and the chain of branches it took since (their parents). */
function sandboxLine(sb: SandboxWire, byTag: Map<string, SnapshotWire>): Set<string> {
  const line = new Set<string>([sb.snapshot_tag]);
  for (const s of byTag.values()) if (s.source_sandbox === sb.id) line.add(s.tag);
  return line;
}

/** A placement that would make a snapshot its own ancestor is dropped (the snapshot goes to the top). */
function breakCycles(
  snapshots: readonly SnapshotWire[],
  sandboxes: readonly SandboxWire[],
  parentOf: Map<string, { snapshot: string } | { sandbox: string } | null>,
): void {
  const snapshotOfSandbox = new Map(sandboxes.map((sb) => [sb.id, sb.snapshot_tag]));
  for (const s of snapshots) {
    const seen = new Set<string>([s.tag]);
    let at = parentOf.get(s.tag) ?? null;
    while (at !== null) {
      const tag = "snapshot" in at ? at.snapshot : snapshotOfSandbox.get(at.sandbox);
      if (tag === undefined) break;
      if (seen.has(tag)) {
        parentOf.set(s.tag, null);
        break;
      }
      seen.add(tag);
      at = parentOf.get(tag) ?? null;
    }
  }
}

function countSandboxes(node: SnapshotNode): number {
  let count = 0;
  for (const child of node.children) {
    if (child.kind === "sandbox") {
      count += 1;
      for (const branch of child.children) count += countSandboxes(branch);
    } else count += countSandboxes(child);
  }
  node.sandboxCount = count;
  return count;
}

function sortChildren(node: SnapshotNode): void {
  node.children.sort((a, b) => {
    if (a.kind !== b.kind) return a.kind === "snapshot" ? -1 : 1;
    if (a.kind === "snapshot" && b.kind === "snapshot") return bySnapshotAge(a, b);
    const x = (a as SandboxNode).sandbox;
    const y = (b as SandboxNode).sandbox;
    return x.created_at_unix - y.created_at_unix || x.id.localeCompare(y.id);
  });
}

function bySnapshotAge(a: SnapshotNode, b: SnapshotNode): number {
  return (
    a.snapshot.created_at_unix - b.snapshot.created_at_unix || a.snapshot.tag.localeCompare(b.snapshot.tag)
  );
}

function missingSnapshot(tag: string): SnapshotWire {
  return {
    tag,
    owner: null,
    dir: "",
    created_at_unix: 0,
    status: "failed",
    bootable: false,
    template: null,
    accelerator: null,
    memory_mib: null,
    parent_tag: null,
    bytes: 0,
    error: "not among the daemon's snapshots (deleted while sandboxes ran on it)",
    vcpus: null,
    source_sandbox: null,
    aliases: [],
    ephemeral: false,
    origin: null,
    branch_mode: null,
    disk_bytes: 0,
    egress_default: null,
  };
}
