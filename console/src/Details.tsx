/**
 * The selected snapshot's or sandbox's facts and actions. Every action shows its own outcome where it was
 * started: the result, or the daemon's error message and code.
 */
import type { ComponentChildren } from "preact";
import { useState } from "preact/hooks";
import type { ConsoleSession, SandboxWire, SnapshotWire, UsageWire } from "../../src/console/protocol.js";
import { snapshotKind } from "../../src/console/tree.js";
import { ApiError, actions, type BranchResult, type EvalResult, type ForkResult } from "./api.js";
import { Files } from "./Files.js";
import { age, bytes, duration, percent, remaining } from "./format.js";
import type { ConsoleState } from "./store.js";

export type Selection = { kind: "snapshot"; key: string } | { kind: "sandbox"; key: string };

interface DetailsProps {
  selection: Selection | null;
  state: ConsoleState;
  features: ConsoleSession["features"];
  now: number;
  onOpenTerminal: (sandboxId: string) => void;
  onSelect: (selection: Selection) => void;
}

export function Details({ selection, state, features, now, onOpenTerminal, onSelect }: DetailsProps) {
  if (selection === null) return <p class="muted pad">Select a snapshot or a sandbox in the tree.</p>;
  if (selection.kind === "snapshot") {
    const snapshot = state.snapshots.get(selection.key);
    if (!snapshot) return <p class="muted pad">Snapshot {selection.key} is gone.</p>;
    const sandboxes = [...state.sandboxes.values()].filter((sb) => sb.snapshot_tag === snapshot.tag);
    return (
      <SnapshotDetails key={snapshot.tag} snapshot={snapshot} sandboxes={sandboxes} onSelect={onSelect} />
    );
  }
  const sandbox = state.sandboxes.get(selection.key);
  if (!sandbox) return <p class="muted pad">Sandbox {selection.key} is gone (killed or expired).</p>;
  return (
    <SandboxDetails
      key={sandbox.id}
      sandbox={sandbox}
      usage={state.usage.get(sandbox.id)}
      features={features}
      now={now}
      onOpenTerminal={onOpenTerminal}
      onSelect={onSelect}
    />
  );
}

// ---- actions

interface ActionState<T> {
  busy: boolean;
  error: ApiError | null;
  result: T | null;
  run: (fn: () => Promise<T>) => Promise<void>;
}

function useAction<T>(): ActionState<T> {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<ApiError | null>(null);
  const [result, setResult] = useState<T | null>(null);
  const run = async (fn: () => Promise<T>) => {
    setBusy(true);
    setError(null);
    setResult(null);
    try {
      setResult(await fn());
    } catch (err) {
      setError(err instanceof ApiError ? err : new ApiError(0, "internal", String(err)));
    } finally {
      setBusy(false);
    }
  };
  return { busy, error, result, run };
}

function ActionError({ error }: { error: ApiError | null }) {
  if (!error) return null;
  return (
    <p class="error" role="alert" data-testid="action-error">
      {error.message}
      {error.status > 0 && (
        <span class="muted">
          {" "}
          ({error.status} {error.code})
        </span>
      )}
    </p>
  );
}

function Section({ title, children }: { title: string; children: ComponentChildren }) {
  return (
    <section class="action">
      <h3>{title}</h3>
      {children}
    </section>
  );
}

function Facts({ rows }: { rows: [string, ComponentChildren][] }) {
  return (
    <dl class="facts">
      {rows.map(([name, value]) => (
        <div key={name}>
          <dt>{name}</dt>
          <dd>{value}</dd>
        </div>
      ))}
    </dl>
  );
}

// ---- snapshot

function SnapshotDetails({
  snapshot: s,
  sandboxes,
  onSelect,
}: {
  snapshot: SnapshotWire;
  sandboxes: SandboxWire[];
  onSelect: (selection: Selection) => void;
}) {
  const spawn = useAction<{ id: string }[]>();
  const [n, setN] = useState(1);
  return (
    <div class="details" data-testid="snapshot-details">
      <h2>
        <span class="mono">{s.tag}</span>{" "}
        <span class={`badge kind-${snapshotKind(s)}`}>{snapshotKind(s)}</span>
      </h2>
      <Facts
        rows={[
          ["status", `${s.status}${s.bootable ? ", bootable" : ", not bootable"}`],
          ["template", s.template ?? "–"],
          [
            "made by",
            s.origin === "branch"
              ? `BRANCH (${s.branch_mode}) of ${s.source_sandbox ?? "?"}`
              : (s.origin ?? "–"),
          ],
          [
            "parent",
            s.parent_tag === null ? (
              "none (stands alone)"
            ) : (
              <button
                type="button"
                class="link mono"
                onClick={() => onSelect({ kind: "snapshot", key: s.parent_tag as string })}
              >
                {s.parent_tag}
              </button>
            ),
          ],
          ["on disk", `${bytes(s.disk_bytes)} (files ${bytes(s.bytes)})`],
          ["machine", `${s.memory_mib ?? "?"} MiB, ${s.vcpus ?? "?"} vCPU, ${s.accelerator ?? "?"}`],
          ["egress default", egressDefault(s.egress_default)],
          ["aliases", s.aliases.length > 0 ? s.aliases.join(", ") : "–"],
          ["created", new Date(s.created_at_unix * 1000).toLocaleString()],
          ["sandboxes", String(sandboxes.length)],
          ...(s.ephemeral
            ? [["note", "a fork point: deleted once nothing needs it"] as [string, string]]
            : []),
          ...(s.error
            ? [["error", <span class="error">{s.error}</span>] as [string, ComponentChildren]]
            : []),
        ]}
      />
      <Section title="Spawn sandboxes">
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            void spawn.run(() => actions.spawn(s.tag, n));
          }}
        >
          <input
            type="number"
            min={1}
            max={1000}
            value={n}
            aria-label="how many"
            onInput={(e) => setN(Number((e.target as HTMLInputElement).value))}
          />
          <button type="submit" disabled={spawn.busy || !s.bootable}>
            {spawn.busy ? "Spawning…" : "Spawn"}
          </button>
        </form>
        <ActionError error={spawn.error} />
        {spawn.result && <p class="ok">Spawned {spawn.result.map((sb) => sb.id).join(", ")}</p>}
      </Section>
    </div>
  );
}

// ---- sandbox

interface SandboxDetailsProps {
  sandbox: SandboxWire;
  usage: UsageWire | undefined;
  features: ConsoleSession["features"];
  now: number;
  onOpenTerminal: (sandboxId: string) => void;
  onSelect: (selection: Selection) => void;
}

function SandboxDetails({
  sandbox: sb,
  usage,
  features,
  now,
  onOpenTerminal,
  onSelect,
}: SandboxDetailsProps) {
  const running = sb.status === "running";
  const policy = sb.network.egress;
  return (
    <div class="details" data-testid="sandbox-details">
      <h2>
        <span class="mono">{sb.id}</span> <span class={`badge status-${sb.status}`}>{sb.status}</span>
      </h2>
      <Facts
        rows={[
          [
            "snapshot",
            <button
              type="button"
              class="link mono"
              onClick={() => onSelect({ kind: "snapshot", key: sb.snapshot_tag })}
            >
              {sb.snapshot_tag}
            </button>,
          ],
          ["age", age(sb.created_at_unix, now)],
          ["timeout", remaining(sb.expires_at_unix_ms, now)],
          ["accelerator", sb.accelerator],
          ["ready in", duration(sb.ready_ms)],
          [
            "memory",
            usage
              ? `PSS ${bytes(usage.pss_bytes)} · private ${bytes(usage.private_bytes)} · RSS ${bytes(usage.rss_bytes)}`
              : "–",
          ],
          [
            "CPU",
            usage ? `${percent(usage.cpu_used_pct)} of a core (over ${duration(usage.cpu_window_ms)})` : "–",
          ],
          ["memory limit", sb.memory_limit_mib === null ? "none" : `${sb.memory_limit_mib} MiB`],
          [
            "network",
            sb.network.kind === "none"
              ? "no NIC"
              : `${sb.network.kind}${sb.network.address ? ` (${sb.network.address})` : ""}`,
          ],
          [
            "egress",
            policy === null ? (
              "–"
            ) : (
              <span>
                {policy.egress} by default
                {policy.allow_out.length > 0 && <> · allow {policy.allow_out.join(", ")}</>}
                {policy.deny_out.length > 0 && <> · deny {policy.deny_out.join(", ")}</>}
              </span>
            ),
          ],
          ["live fork", sb.live_fork ? "yes (live BRANCH possible)" : "no"],
          ["branches", `${sb.branch_count}${sb.last_branch_tag ? ` (last ${sb.last_branch_tag})` : ""}`],
          ["template alias", sb.template_alias ?? "–"],
          [
            "metadata",
            Object.keys(sb.metadata).length === 0 ? (
              "–"
            ) : (
              <ul class="metadata">
                {Object.entries(sb.metadata).map(([k, v]) => (
                  <li key={k}>
                    <span class="mono">{k}</span> = <span class="mono">{v}</span>
                  </li>
                ))}
              </ul>
            ),
          ],
        ]}
      />
      <div class="buttons">
        <button type="button" disabled={!running} onClick={() => onOpenTerminal(sb.id)}>
          Open terminal
        </button>
        <PauseResume sandbox={sb} available={features.pause} />
      </div>
      <RunCode sandbox={sb} />
      <Files sandbox={sb} />
      <Branch sandbox={sb} />
      <Fork sandbox={sb} />
      <SetTimeout sandbox={sb} />
      <Kill sandbox={sb} />
    </div>
  );
}

function PauseResume({ sandbox: sb, available }: { sandbox: SandboxWire; available: boolean }) {
  const action = useAction<unknown>();
  // Not every daemon pauses sandboxes: the buttons say so rather than pretend.
  const paused = (sb.status as string) === "paused";
  if (!available) {
    return (
      <button
        type="button"
        disabled
        title="this daemon cannot pause sandboxes"
        data-testid="pause-unavailable"
      >
        Pause (unavailable)
      </button>
    );
  }
  return (
    <>
      <button
        type="button"
        disabled={action.busy}
        onClick={() => void action.run(() => (paused ? actions.resume(sb.id) : actions.pause(sb.id)))}
      >
        {paused ? "Resume" : "Pause"}
      </button>
      <ActionError error={action.error} />
    </>
  );
}

function RunCode({ sandbox: sb }: { sandbox: SandboxWire }) {
  const action = useAction<EvalResult>();
  const [code, setCode] = useState("1 + 1");
  const result = action.result;
  return (
    <Section title="Run code (Python, the warm interpreter)">
      <form
        onSubmit={(e) => {
          e.preventDefault();
          void action.run(() => actions.eval(sb.id, code));
        }}
      >
        <textarea
          rows={3}
          value={code}
          aria-label="Python code"
          spellcheck={false}
          onInput={(e) => setCode((e.target as HTMLTextAreaElement).value)}
        />
        <button type="submit" disabled={action.busy || sb.status !== "running"}>
          {action.busy ? "Running…" : "Run"}
        </button>
      </form>
      <ActionError error={action.error} />
      {result && (
        <div class="output" data-testid="eval-output">
          {result.stdout && <pre>{result.stdout}</pre>}
          {result.stderr && <pre class="stderr">{result.stderr}</pre>}
          {result.error ? <pre class="error">{result.error}</pre> : <pre>{result.result ?? "None"}</pre>}
          <span class="muted">{duration(result.duration_ms)}</span>
        </div>
      )}
    </Section>
  );
}

function Branch({ sandbox: sb }: { sandbox: SandboxWire }) {
  const action = useAction<BranchResult>();
  const [mode, setMode] = useState(sb.live_fork ? "live" : "diff");
  const [tag, setTag] = useState("");
  return (
    <Section title="Branch (snapshot it; it keeps running)">
      <form
        class="inline"
        onSubmit={(e) => {
          e.preventDefault();
          void action.run(() =>
            actions.branch(sb.id, tag.trim() === "" ? { mode } : { mode, tag: tag.trim() }),
          );
        }}
      >
        <select
          value={mode}
          aria-label="branch mode"
          onChange={(e) => setMode((e.target as HTMLSelectElement).value)}
        >
          <option value="full">full (stands alone)</option>
          <option value="diff">diff (a layer)</option>
          <option value="live" disabled={!sb.live_fork}>
            live (needs live_fork)
          </option>
        </select>
        <input
          type="text"
          placeholder="tag (optional)"
          aria-label="new snapshot tag"
          value={tag}
          onInput={(e) => setTag((e.target as HTMLInputElement).value)}
        />
        <button type="submit" disabled={action.busy || sb.status !== "running"}>
          {action.busy ? "Branching…" : "Branch"}
        </button>
      </form>
      <ActionError error={action.error} />
      {action.result && (
        <p class="ok" data-testid="branch-result">
          Snapshot <span class="mono">{action.result.tag}</span> ({action.result.mode}), paused{" "}
          {action.result.pause_ms} ms, wrote {bytes(action.result.bytes_written)}
        </p>
      )}
    </Section>
  );
}

function Fork({ sandbox: sb }: { sandbox: SandboxWire }) {
  const action = useAction<ForkResult>();
  const [count, setCount] = useState(2);
  const result = action.result;
  return (
    <Section title="Fork N (branch once, restore N children)">
      <form
        class="inline"
        onSubmit={(e) => {
          e.preventDefault();
          void action.run(() => actions.fork(sb.id, count));
        }}
      >
        <input
          type="number"
          min={1}
          max={1000}
          value={count}
          aria-label="children"
          onInput={(e) => setCount(Number((e.target as HTMLInputElement).value))}
        />
        <button type="submit" disabled={action.busy || sb.status !== "running"}>
          {action.busy ? "Forking…" : "Fork"}
        </button>
      </form>
      <ActionError error={action.error} />
      {result && (
        <div class="ok" data-testid="fork-result">
          From <span class="mono">{result.snapshot_tag}</span> (paused {result.pause_ms} ms):
          <ul>
            {result.children.map((c, i) =>
              c.sandbox ? (
                <li key={c.sandbox.id} class="mono">
                  {c.sandbox.id}
                </li>
              ) : (
                <li key={i} class="error">
                  {c.error?.error} ({c.error?.code})
                </li>
              ),
            )}
          </ul>
        </div>
      )}
    </Section>
  );
}

function SetTimeout({ sandbox: sb }: { sandbox: SandboxWire }) {
  const action = useAction<unknown>();
  const [minutes, setMinutes] = useState(30);
  return (
    <Section title="Set timeout (from now; 0 = no limit)">
      <form
        class="inline"
        onSubmit={(e) => {
          e.preventDefault();
          void action.run(() => actions.setTimeout(sb.id, Math.round(minutes * 60_000)));
        }}
      >
        <input
          type="number"
          min={0}
          step="any"
          value={minutes}
          aria-label="minutes"
          onInput={(e) => setMinutes(Number((e.target as HTMLInputElement).value))}
        />
        <span class="muted">minutes</span>
        <button type="submit" disabled={action.busy || sb.status !== "running"}>
          Set
        </button>
      </form>
      <ActionError error={action.error} />
      {action.result !== null && <p class="ok">Timeout set.</p>}
    </Section>
  );
}

function Kill({ sandbox: sb }: { sandbox: SandboxWire }) {
  const action = useAction<void>();
  const [confirming, setConfirming] = useState(false);
  return (
    <Section title="Kill">
      {confirming ? (
        <div class="confirm" role="alertdialog" aria-label="confirm kill">
          <p>
            Kill <span class="mono">{sb.id}</span>? Its VM stops and everything in it not branched is lost.
          </p>
          <button
            type="button"
            class="danger"
            disabled={action.busy}
            onClick={() => void action.run(() => actions.kill(sb.id)).then(() => setConfirming(false))}
          >
            {action.busy ? "Killing…" : "Kill sandbox"}
          </button>
          <button type="button" onClick={() => setConfirming(false)}>
            Cancel
          </button>
        </div>
      ) : (
        <button type="button" class="danger" onClick={() => setConfirming(true)}>
          Kill…
        </button>
      )}
      <ActionError error={action.error} />
    </Section>
  );
}

/** A snapshot's template egress default in a line; null: the daemon's --egress applies. */
function egressDefault(policy: SnapshotWire["egress_default"]): string {
  if (!policy) return "the daemon's";
  const lists = [
    policy.allow_out.length > 0 ? `allow ${policy.allow_out.join(", ")}` : "",
    policy.deny_out.length > 0 ? `deny ${policy.deny_out.join(", ")}` : "",
  ].filter(Boolean);
  return [`${policy.egress} (the template's)`, ...lists].join("; ");
}
