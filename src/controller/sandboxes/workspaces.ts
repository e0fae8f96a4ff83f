/**
 * forkd v0.5's stateful workspaces, on pause and resume: a workspace is a name for one sandbox, suspended
 * (paused) and resumed by that name. Unlike v0.5, which snapshotted the sandbox, killed it and spawned a new one
 * on resume, the sandbox keeps its id, network namespace, address and egress policy across suspends.
 *
 * "stale" keeps v0.5's meaning: the workspace's sandbox is gone (a host reboot while it ran, or it was killed
 * through the sandbox API); resume then starts a new sandbox from its latest suspend, or from its source
 * snapshot if it never was suspended.
 */
import path from "node:path";
import { conflict, ForkdError, invalidArgument, notFound } from "../../common/errors.js";
import { WORKSPACE_NAME_PATTERN } from "../../common/limits.js";
import type { StateDb, WorkspaceRow } from "../../store/db.js";
import { SNAPSHOT_FILES } from "../machines/machine.js";
import type { NetworkRequest, SandboxService, WorkspaceInfo, WorkspaceService } from "../sandbox-service.js";

/** v0.5's rule for workspace names (they become part of snapshot tags there). */
const WORKSPACE_NAME = new RegExp(WORKSPACE_NAME_PATTERN);

type Sandboxes = Pick<SandboxService, "spawn" | "pause" | "resume" | "kill">;

export class Workspaces implements WorkspaceService {
  constructor(
    private readonly db: StateDb,
    private readonly sandboxes: Sandboxes,
    private readonly snapshotsDir: string,
  ) {}

  list(): WorkspaceInfo[] {
    return this.db.workspaces().map((row) => this.info(row));
  }

  get(name: string): WorkspaceInfo {
    return this.info(this.row(name));
  }

  async create(request: {
    name: string;
    snapshotTag: string;
    memoryLimitMiB?: number;
    network?: NetworkRequest;
    ownNamespace?: boolean;
    signal?: AbortSignal;
  }): Promise<WorkspaceInfo> {
    const name = assertWorkspaceName(request.name);
    if (this.db.workspace(name)) throw conflict(`workspace ${name} already exists; DELETE first`);
    const [sandbox] = await this.sandboxes.spawn({
      snapshotTag: request.snapshotTag,
      n: 1,
      memoryLimitMiB: request.memoryLimitMiB,
      network: request.network,
      ownNamespace: request.ownNamespace,
      // A workspace lives until deleted, as in v0.5.
      timeoutMs: 0,
      signal: request.signal,
    });
    const id = (sandbox as { id: string }).id;
    const now = Math.floor(Date.now() / 1000);
    const inserted = this.db.insertWorkspace({
      name,
      sandbox_id: id,
      source_snapshot_tag: request.snapshotTag,
      created_at_unix: now,
      last_active_unix: now,
    });
    if (!inserted) {
      await this.sandboxes.kill(id).catch(() => {});
      throw conflict(`workspace ${name} already exists; DELETE first`);
    }
    return this.get(name);
  }

  async suspend(
    name: string,
    request: { diff?: boolean; signal?: AbortSignal } = {},
  ): Promise<WorkspaceInfo> {
    const row = this.row(name);
    const info = this.info(row);
    if (info.status !== "running") {
      throw invalidArgument(
        `workspace ${name} is ${info.status}, not running: suspend requires a live sandbox`,
      );
    }
    await this.sandboxes.pause(row.sandbox_id, {
      merge: request.diff === true ? "auto" : "always",
      signal: request.signal,
    });
    this.touch(name);
    return this.get(name);
  }

  async resume(name: string, request: { signal?: AbortSignal } = {}): Promise<WorkspaceInfo> {
    const row = this.row(name);
    const info = this.info(row);
    if (info.status === "running") {
      throw invalidArgument(`workspace ${name} is already running (sandbox ${row.sandbox_id})`);
    }
    if (info.status === "suspended") {
      await this.sandboxes.resume(row.sandbox_id, { signal: request.signal });
    } else {
      await this.restart(row, info.current_state_tag, request.signal);
    }
    this.touch(name);
    return this.get(name);
  }

  async delete(name: string): Promise<void> {
    const row = this.row(name);
    if (this.db.sandbox(row.sandbox_id)) {
      await this.sandboxes.kill(row.sandbox_id).catch((err: unknown) => {
        if (!(err instanceof ForkdError && err.code === "not_found")) throw err;
      });
    }
    this.db.deleteWorkspace(name);
  }

  /** A stale workspace: a new sandbox from its latest suspend (or its source), then the old record goes. */
  private async restart(
    row: WorkspaceRow,
    stateTag: string | undefined,
    signal?: AbortSignal,
  ): Promise<void> {
    const old = this.db.sandbox(row.sandbox_id);
    const [sandbox] = await this.sandboxes.spawn({
      snapshotTag: stateTag ?? row.source_snapshot_tag,
      n: 1,
      memoryLimitMiB: old?.memory_limit_mib ?? undefined,
      timeoutMs: 0,
      signal,
    });
    this.db.updateWorkspace(row.name, { sandbox_id: (sandbox as { id: string }).id });
    if (old) await this.sandboxes.kill(old.id).catch(() => {});
  }

  private touch(name: string): void {
    this.db.updateWorkspace(name, { last_active_unix: Math.floor(Date.now() / 1000) });
  }

  private row(name: string): WorkspaceRow {
    const row = WORKSPACE_NAME.test(name) ? this.db.workspace(name) : undefined;
    if (!row) throw notFound(`workspace ${name} not found`);
    return row;
  }

  private info(row: WorkspaceRow): WorkspaceInfo {
    const sandbox = this.db.sandbox(row.sandbox_id);
    const stateTag = sandbox ? (JSON.parse(sandbox.pause_tags) as string[]).at(-1) : undefined;
    const status: WorkspaceInfo["status"] =
      !sandbox || sandbox.status === "dead" || sandbox.status === "stopping"
        ? "stale"
        : sandbox.status === "paused" || sandbox.status === "resuming"
          ? "suspended"
          : "running";
    return {
      id: `ws-${row.sandbox_id}`,
      name: row.name,
      source_snapshot_tag: row.source_snapshot_tag,
      ...(stateTag !== undefined ? { current_state_tag: stateTag } : {}),
      status,
      ...(status === "running" ? { live_sandbox_id: row.sandbox_id } : {}),
      created_at_unix: row.created_at_unix,
      last_active_unix: row.last_active_unix,
      ...(stateTag !== undefined
        ? { last_branch_memory_path: path.join(this.snapshotsDir, stateTag, SNAPSHOT_FILES.memoryLayer) }
        : {}),
    };
  }
}

export function assertWorkspaceName(name: unknown): string {
  if (typeof name !== "string" || !WORKSPACE_NAME.test(name)) {
    throw invalidArgument("workspace name must be 1-64 chars, ASCII alnum or dash/underscore");
  }
  return name;
}
