/**
 * The fork tree: templates → snapshots (chain layers nested under their parent) → sandboxes restored from each
 * → the snapshots branched from those. Rows are memoized by their entity objects, which the store keeps when an
 * entity did not change, so a feed update re-renders only what changed.
 */
import { memo } from "preact/compat";
import { useMemo, useState } from "preact/hooks";
import type { SandboxWire, SnapshotWire, UsageWire } from "../../src/console/protocol.js";
import { buildTree, type SandboxNode, type SnapshotNode, snapshotKind } from "../../src/console/tree.js";
import type { Selection } from "./Details.js";
import { ageCoarse, bytes, percent } from "./format.js";
import type { ConsoleState } from "./store.js";

interface TreeProps {
  state: ConsoleState;
  selection: Selection | null;
  onSelect: (selection: Selection) => void;
  now: number;
}

export function Tree({ state, selection, onSelect, now }: TreeProps) {
  const groups = useMemo(
    () => buildTree([...state.snapshots.values()], [...state.sandboxes.values()]),
    [state.snapshots, state.sandboxes],
  );
  const [collapsed, setCollapsed] = useState<ReadonlySet<string>>(new Set());
  const toggle = (key: string) =>
    setCollapsed((current) => {
      const next = new Set(current);
      if (next.has(key)) next.delete(key);
      else next.add(key);
      return next;
    });
  // Minutes are enough for ages in the tree; re-rendering every row each second is not needed.
  const minute = Math.floor(now / 60_000) * 60_000;
  const context: RowContext = { selection, onSelect, toggle, collapsed, usage: state.usage, minute };

  if (groups.length === 0) {
    return (
      <p class="muted empty">
        {state.live
          ? "No snapshots yet: make one with forkd snapshot --tag pyagent."
          : "Waiting for the daemon…"}
      </p>
    );
  }
  return (
    <ul class="tree">
      {groups.map((group) => {
        const key = `template:${group.template ?? ""}`;
        const open = !collapsed.has(key);
        return (
          <li key={key} data-testid={`template-${group.template ?? "unknown"}`}>
            <div class="row template">
              <button
                type="button"
                class="twisty"
                onClick={() => toggle(key)}
                aria-label="expand or collapse"
              >
                {open ? "▾" : "▸"}
              </button>
              <span class="name">{group.template ?? "(template unknown)"}</span>
              <span class="muted">
                template · {group.roots.length} snapshot{group.roots.length === 1 ? "" : "s"} ·{" "}
                {group.sandboxCount} sandbox{group.sandboxCount === 1 ? "" : "es"}
              </span>
            </div>
            {open && (
              <ul>
                {group.roots.map((node) => (
                  <SnapshotBranch key={node.snapshot.tag} node={node} context={context} />
                ))}
              </ul>
            )}
          </li>
        );
      })}
    </ul>
  );
}

interface RowContext {
  selection: Selection | null;
  onSelect: (selection: Selection) => void;
  toggle: (key: string) => void;
  collapsed: ReadonlySet<string>;
  usage: ReadonlyMap<string, UsageWire>;
  minute: number;
}

function SnapshotBranch({ node, context }: { node: SnapshotNode; context: RowContext }) {
  const key = `snapshot:${node.snapshot.tag}`;
  const open = !context.collapsed.has(key);
  const selected = context.selection?.kind === "snapshot" && context.selection.key === node.snapshot.tag;
  return (
    <li>
      <SnapshotRow
        snapshot={node.snapshot}
        count={node.sandboxCount}
        hasChildren={node.children.length > 0}
        open={open}
        selected={selected}
        onToggle={context.toggle}
        onSelect={context.onSelect}
      />
      {open && node.children.length > 0 && (
        <ul>
          {node.children.map((child) =>
            child.kind === "snapshot" ? (
              <SnapshotBranch key={`s:${child.snapshot.tag}`} node={child} context={context} />
            ) : (
              <SandboxBranch key={`b:${child.sandbox.id}`} node={child} context={context} />
            ),
          )}
        </ul>
      )}
    </li>
  );
}

function SandboxBranch({ node, context }: { node: SandboxNode; context: RowContext }) {
  const key = `sandbox:${node.sandbox.id}`;
  const open = !context.collapsed.has(key);
  const selected = context.selection?.kind === "sandbox" && context.selection.key === node.sandbox.id;
  return (
    <li>
      <SandboxRow
        sandbox={node.sandbox}
        usage={context.usage.get(node.sandbox.id)}
        hasChildren={node.children.length > 0}
        open={open}
        selected={selected}
        minute={context.minute}
        onToggle={context.toggle}
        onSelect={context.onSelect}
      />
      {open && node.children.length > 0 && (
        <ul>
          {node.children.map((child) => (
            <SnapshotBranch key={`s:${child.snapshot.tag}`} node={child} context={context} />
          ))}
        </ul>
      )}
    </li>
  );
}

interface SnapshotRowProps {
  snapshot: SnapshotWire;
  count: number;
  hasChildren: boolean;
  open: boolean;
  selected: boolean;
  onToggle: (key: string) => void;
  onSelect: (selection: Selection) => void;
}

const SnapshotRow = memo(function SnapshotRow(props: SnapshotRowProps) {
  const { snapshot: s } = props;
  const kind = snapshotKind(s);
  return (
    <div
      class={`row snapshot${props.selected ? " selected" : ""}`}
      data-testid={`snapshot-${s.tag}`}
      data-kind={kind}
    >
      <Twisty
        visible={props.hasChildren}
        open={props.open}
        onClick={() => props.onToggle(`snapshot:${s.tag}`)}
      />
      <button
        type="button"
        class="name link"
        onClick={() => props.onSelect({ kind: "snapshot", key: s.tag })}
      >
        {s.tag}
      </button>
      <span class={`badge kind-${kind}`}>{kind}</span>
      {s.ephemeral && <span class="badge">fork point</span>}
      {s.aliases.map((a) => (
        <span key={a} class="badge alias">
          {a}
        </span>
      ))}
      <span class="muted">{bytes(s.disk_bytes)} on disk</span>
      <span class="muted">
        {props.count} sandbox{props.count === 1 ? "" : "es"}
      </span>
      {s.error && <span class="error small">{s.error}</span>}
    </div>
  );
});

interface SandboxRowProps {
  sandbox: SandboxWire;
  usage: UsageWire | undefined;
  hasChildren: boolean;
  open: boolean;
  selected: boolean;
  minute: number;
  onToggle: (key: string) => void;
  onSelect: (selection: Selection) => void;
}

const SandboxRow = memo(function SandboxRow(props: SandboxRowProps) {
  const { sandbox: sb, usage } = props;
  return (
    <div
      class={`row sandbox${props.selected ? " selected" : ""}`}
      data-testid={`sandbox-${sb.id}`}
      data-status={sb.status}
    >
      <Twisty
        visible={props.hasChildren}
        open={props.open}
        onClick={() => props.onToggle(`sandbox:${sb.id}`)}
      />
      <button
        type="button"
        class="name link mono"
        onClick={() => props.onSelect({ kind: "sandbox", key: sb.id })}
      >
        {sb.id}
      </button>
      <span class={`badge status-${sb.status}`}>{sb.status}</span>
      <span class="muted">{ageCoarse(sb.created_at_unix, props.minute)}</span>
      <span class="muted">PSS {bytes(usage?.pss_bytes)}</span>
      <span class="muted">CPU {percent(usage?.cpu_used_pct)}</span>
      {sb.branch_count > 0 && <span class="muted">{sb.branch_count} branches</span>}
    </div>
  );
});

function Twisty({ visible, open, onClick }: { visible: boolean; open: boolean; onClick: () => void }) {
  if (!visible) return <span class="twisty" />;
  return (
    <button
      type="button"
      class="twisty"
      onClick={onClick}
      aria-expanded={open}
      aria-label="expand or collapse"
    >
      {open ? "▾" : "▸"}
    </button>
  );
}
