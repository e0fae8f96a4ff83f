/**
 * The daemon's running sandboxes: the VM handle of each (ours or adopted after a restart), the re-attaches
 * still in flight, and the checks every verb makes first: the sandbox's record exists, and for a call into its
 * guest that its VM runs (not paused, starting, being stopped or re-attached), with why not otherwise.
 */

import type { AgentClient } from "../../agent/host/client.js";
import { conflict, ForkdError, notFound } from "../../common/errors.js";
import { assertSandboxRef, isValidSandboxId } from "../../common/names.js";
import type { SandboxRow, StateDb } from "../../store/db.js";
import type { SandboxHandle } from "../machines/sandbox-vm.js";

/** A sandbox whose VM this daemon serves. */
export interface Live {
  handle: SandboxHandle;
  /** Set when a kill started: calls still running then fail as "killed", not as a broken connection. */
  killing: boolean;
  /** Set when a pause started: calls still running then fail as "paused". */
  pausing?: boolean;
}

export class LiveSandboxes {
  private readonly live = new Map<string, Live>();
  /** Sandboxes found running at start-up and not re-attached yet, each with its re-attach. */
  readonly reattaching = new Map<string, Promise<void>>();

  constructor(private readonly db: Pick<StateDb, "sandbox">) {}

  /** Sandbox `id`'s record; not_found if unknown (or not a sandbox id at all). */
  row(id: string): SandboxRow {
    assertSandboxRef(id);
    const row = isValidSandboxId(id) ? this.db.sandbox(id) : undefined;
    if (!row) throw notFound(`sandbox ${id} not found`);
    return row;
  }

  /** Takes a VM into the daemon's care: its calls are served from now on. */
  add(handle: SandboxHandle): void {
    this.live.set(handle.id, { handle, killing: false });
  }

  /** The VM of `id`, whatever it is doing (being killed or paused included); undefined without one. */
  get(id: string): Live | undefined {
    return this.live.get(id);
  }

  has(id: string): boolean {
    return this.live.has(id);
  }

  delete(id: string): void {
    this.live.delete(id);
  }

  get size(): number {
    return this.live.size;
  }

  all(): Live[] {
    return [...this.live.values()];
  }

  /** Lets go of every VM without stopping it (the next daemon re-attaches). */
  releaseAll(): void {
    for (const { handle } of this.live.values()) handle.release();
    this.live.clear();
  }

  /** The running VM of `id`; conflict (or unavailable while it re-attaches) saying why there is none. */
  running(id: string): Live {
    const row = this.row(id);
    const live = this.live.get(id);
    if (live && !live.killing && !live.pausing) return live;
    if (this.reattaching.has(id)) {
      throw new ForkdError(
        "unavailable",
        `sandbox ${id} is re-attaching after a daemon restart; retry in a moment`,
      );
    }
    if (row.status === "dead") throw conflict(`sandbox ${id} is dead: ${row.error ?? "its VM exited"}`);
    if (row.status === "starting") throw conflict(`sandbox ${id} is still starting`);
    if (row.status === "paused") {
      throw new ForkdError(
        "conflict",
        `sandbox ${id} is paused; resume it first (POST /v1/sandboxes/${id}/resume)`,
        {
          detail: { status: "paused" },
        },
      );
    }
    if (row.status === "pausing") throw conflict(`sandbox ${id} is being paused`, { status: "pausing" });
    if (row.status === "resuming") throw conflict(`sandbox ${id} is being resumed`, { status: "resuming" });
    throw conflict(`sandbox ${id} is being stopped`);
  }

  /** Runs `fn` with the agent of running sandbox `id`; a call cut short by a kill or pause says so. */
  async call<T>(id: string, fn: (agent: AgentClient) => Promise<T>): Promise<T> {
    // A call right after a restart waits for its own sandbox's re-attach (at most REATTACH_TIMEOUT_MS), not others'.
    await this.reattaching.get(id)?.catch(() => {});
    const live = this.running(id);
    try {
      return await fn(live.handle.agent);
    } catch (err) {
      if (live.pausing) {
        throw new ForkdError("conflict", `sandbox ${id} was paused while the call was running`, {
          cause: err,
        });
      }
      if (live.killing || !this.live.has(id)) {
        throw new ForkdError("conflict", `sandbox ${id} was killed while the call was running`, {
          cause: err,
        });
      }
      throw err;
    }
  }
}
