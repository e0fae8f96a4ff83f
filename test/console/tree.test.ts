/**
 * The console's fork tree (src/console/tree.ts) from snapshot and sandbox lists shaped like the daemon's: chains
 * nest layer under parent, sandboxes sit under the snapshot they were restored from, branches under the sandbox
 * they were taken of, and nothing is lost or shown twice whatever the input.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { SandboxWire, SnapshotWire } from "../../src/console/protocol.js";
import { buildTree, type SnapshotNode, snapshotKind, type TreeNode } from "../../src/console/tree.js";

let clock = 1_700_000_000;

function snapshot(tag: string, fields: Partial<SnapshotWire> = {}): SnapshotWire {
  return {
    tag,
    dir: `/s/${tag}`,
    created_at_unix: clock++,
    status: "ready",
    bootable: true,
    template: "pyagent",
    accelerator: "tcg",
    memory_mib: 512,
    parent_tag: null,
    bytes: 1,
    error: null,
    vcpus: 1,
    source_sandbox: null,
    aliases: [],
    ephemeral: false,
    owner: null,
    origin: "template",
    branch_mode: null,
    disk_bytes: 1,
    egress_default: null,
    ...fields,
  };
}

function sandbox(id: string, tag: string, fields: Partial<SandboxWire> = {}): SandboxWire {
  return {
    id,
    snapshot_tag: tag,
    created_at_unix: clock++,
    pid: 1,
    memory_limit_mib: null,
    public_ports: true,
    status: "running",
    expires_at_unix_ms: null,
    ready_ms: 1,
    accelerator: "tcg",
    live_fork: false,
    has_branched: false,
    branch_count: 0,
    last_branch_tag: null,
    last_branch_memory_path: null,
    metadata: {},
    template_alias: null,
    timeout_ms: null,
    on_timeout: "kill",
    auto_resume: false,
    pause_tag: null,
    paused_at_unix_ms: null,
    owner: null,
    limits: { memory_mib: null, cpu_millicores: null, pids: null, disk_mib: null },
    netns: null,
    guest_addr: null,
    network: { kind: "none", address: null, egress: null },
    ...fields,
  };
}

const branch = (tag: string, mode: "full" | "diff" | "live", source: string, parent: string | null) =>
  snapshot(tag, { origin: "branch", branch_mode: mode, source_sandbox: source, parent_tag: parent });

/** The tree as indented lines, for readable comparisons. */
function outline(nodes: readonly TreeNode[], depth = 0): string[] {
  return nodes.flatMap((node) =>
    node.kind === "snapshot"
      ? [
          `${"  ".repeat(depth)}${node.snapshot.tag} [${snapshotKind(node.snapshot)}]`,
          ...outline(node.children, depth + 1),
        ]
      : [`${"  ".repeat(depth)}${node.sandbox.id}`, ...outline(node.children, depth + 1)],
  );
}

describe("the console's fork tree", () => {
  it("nests chains, sandboxes and their branches under what they came from", () => {
    const snapshots = [
      snapshot("pyagent"),
      snapshot("layer1", { origin: "branch", branch_mode: "diff", parent_tag: "pyagent" }),
      snapshot("layer2", { origin: "branch", branch_mode: "live", parent_tag: "layer1" }),
      branch("b-full", "full", "sb-a", null),
      branch("b-diff", "diff", "sb-a", "pyagent"),
      branch("b-diff2", "diff", "sb-a", "b-diff"),
      snapshot("flat", { origin: "compact" }),
      snapshot("other", { template: "node" }),
    ];
    const sandboxes = [
      sandbox("sb-a", "pyagent"),
      sandbox("sb-b", "layer2"),
      sandbox("sb-c", "b-diff"),
      sandbox("sb-d", "b-full", { status: "dead" }),
    ];
    const groups = buildTree(snapshots, sandboxes);
    assert.deepEqual(
      groups.map((g) => g.template),
      ["node", "pyagent"],
    );
    const pyagent = groups[1];
    assert.deepEqual(outline(pyagent?.roots ?? []), [
      "pyagent [template]",
      "  layer1 [diff]",
      "    layer2 [live]",
      "      sb-b",
      "  sb-a",
      "    b-full [full]",
      "      sb-d",
      "    b-diff [diff]",
      "      b-diff2 [diff]",
      "      sb-c",
      "flat [compact]",
    ]);
    assert.equal(pyagent?.sandboxCount, 4);
    assert.equal((pyagent?.roots[0] as SnapshotNode | undefined)?.sandboxCount, 4);
  });

  it("puts a branch under its parent once its sandbox is gone", () => {
    const snapshots = [
      snapshot("pyagent"),
      branch("b-diff", "diff", "sb-gone", "pyagent"),
      branch("b-full", "full", "sb-gone", null),
    ];
    const groups = buildTree(snapshots, []);
    assert.deepEqual(outline(groups[0]?.roots ?? []), [
      "pyagent [template]",
      "  b-diff [diff]",
      "b-full [full]",
    ]);
  });

  it("shows everything exactly once for inputs no daemon should produce", () => {
    const snapshots = [
      snapshot("loop-a", { parent_tag: "loop-b" }),
      snapshot("loop-b", { parent_tag: "loop-a" }),
      snapshot("lost-parent", { parent_tag: "deleted" }),
      snapshot("writing", { status: "writing", template: null, origin: null }),
      // A branch whose source was restored from the branch itself.
      branch("self", "diff", "sb-self", "self"),
    ];
    const sandboxes = [sandbox("sb-self", "self"), sandbox("sb-orphan", "deleted-snapshot")];
    const lines = buildTree(snapshots, sandboxes).flatMap((g) => outline(g.roots));
    const names = lines.map((l) => l.trim().split(" ")[0]);
    for (const name of ["loop-a", "loop-b", "lost-parent", "writing", "self", "sb-self", "sb-orphan"]) {
      assert.equal(names.filter((n) => n === name).length, 1, `${name} once in:\n${lines.join("\n")}`);
    }
    assert.ok(
      lines.some((l) => l.startsWith("deleted-snapshot [failed]")),
      "orphans hang under a placeholder",
    );
  });

  it("counts 500 sandboxes and 50 branches in one tree", () => {
    const snapshots = [snapshot("pyagent")];
    const sandboxes = Array.from({ length: 500 }, (_, i) =>
      sandbox(`sb-${i.toString(16).padStart(12, "0")}`, "pyagent"),
    );
    for (let i = 0; i < 50; i++)
      snapshots.push(branch(`b-${i}`, "diff", sandboxes[i]?.id as string, "pyagent"));
    const groups = buildTree(snapshots, sandboxes);
    assert.equal(groups[0]?.sandboxCount, 500);
    const root = groups[0]?.roots[0] as SnapshotNode;
    assert.equal(root.children.length, 500, "the branches hang under their sandboxes, not the snapshot");
    assert.equal(outline(groups[0]?.roots ?? []).length, 1 + 500 + 50);
  });
});
