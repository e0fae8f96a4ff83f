/**
 * Snapshot chains: a branch snapshot names its parent by tag and by the sha256 of the parent's manifest, so a
 * parent that was replaced or tampered with is noticed instead of silently producing a wrong child.
 */
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { ForkdError } from "../common/errors.js";
import { MANIFEST_FILE } from "./manifest.js";
import type { SnapshotStore, StoredSnapshot } from "./snapshot-store.js";

/**
 * Layers a chain may have above its root. Each layer adds a disk layer QEMU opens at every child start and a
 * memory layer applied when the chain's RAM image is assembled; past this, compact the chain instead.
 */
export const MAX_CHAIN_DEPTH = 16;

export async function manifestDigest(snapshot: StoredSnapshot): Promise<string> {
  const bytes = await readFile(path.join(snapshot.dir, MANIFEST_FILE));
  return createHash("sha256").update(bytes).digest("hex");
}

/**
 * The chain from its root to `tag` (root first), with every edge checked: the parent exists, its manifest
 * digest is the one the child recorded, no cycles, depth within MAX_CHAIN_DEPTH. Errors name the layer.
 */
export async function resolveChain(store: SnapshotStore, tag: string): Promise<StoredSnapshot[]> {
  const chain: StoredSnapshot[] = [];
  const seen = new Set<string>();
  let current = await store.get(tag);
  for (;;) {
    if (seen.has(current.tag)) {
      throw new ForkdError("unprocessable", `snapshot ${tag}: its chain has a cycle at ${current.tag}`);
    }
    seen.add(current.tag);
    chain.unshift(current);
    const parent = current.manifest.parent;
    if (!parent) break;
    if (chain.length > MAX_CHAIN_DEPTH) {
      throw new ForkdError(
        "unprocessable",
        `snapshot ${tag}: chain deeper than ${MAX_CHAIN_DEPTH} layers; compact it`,
      );
    }
    let next: StoredSnapshot;
    try {
      next = await store.get(parent.tag);
    } catch (err) {
      if (err instanceof ForkdError && err.code === "not_found") {
        throw new ForkdError(
          "conflict",
          `snapshot ${tag}: layer ${current.tag} depends on ${parent.tag}, which is missing (orphaned by rmi --force?)`,
        );
      }
      throw err;
    }
    if ((await manifestDigest(next)) !== parent.manifestSha256) {
      throw new ForkdError(
        "unprocessable",
        `snapshot ${tag}: layer ${current.tag} was made on a different ${parent.tag} (its manifest changed)`,
      );
    }
    current = next;
  }
  return chain;
}

/** Snapshots whose parent is `tag` (direct dependents). */
export async function dependentsOf(store: SnapshotStore, tag: string): Promise<string[]> {
  return (await store.list()).filter((s) => s.manifest.parent?.tag === tag).map((s) => s.tag);
}
