/**
 * envd's pollable watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher): a directory watch the daemon
 * holds for a client that cannot keep a stream open, with its events kept (bounded) until polled. A watcher
 * belongs to one sandbox; its id is random and only that sandbox's calls can read or remove it.
 */

import { randomUUID } from "node:crypto";
import type { FsEvent, WatchHandle } from "../../agent/host/types.js";
import { errorMessage, ForkdError, notFound } from "../../common/errors.js";
import type { SandboxService } from "../../controller/sandbox-service.js";
import { uploadEventFilter } from "./upload-names.js";

/** Events kept per watcher between polls; older ones are dropped beyond this (and counted). */
export const MAX_KEPT_EVENTS = 4096;
export const MAX_WATCHERS_PER_SANDBOX = 64;
export const MAX_WATCHERS = 1024;
/** An ended watcher nobody polls or removes is forgotten after this. */
const ENDED_TTL_MS = 10 * 60_000;

interface Watcher {
  sandboxId: string;
  path: string;
  includeEntry: boolean;
  handle: WatchHandle;
  events: FsEvent[];
  dropped: number;
  ended: { atMs: number; reason: string } | undefined;
}

export class Watchers {
  private readonly watchers = new Map<string, Watcher>();

  /** A watcher of `path` in sandbox `sandboxId`, watched through `files` (the caller's view of the services). */
  create(
    files: Pick<SandboxService["files"], "watch">,
    sandboxId: string,
    path: string,
    options: { recursive: boolean; includeEntry: boolean },
  ): string {
    this.forgetEnded();
    const mine = [...this.watchers.values()].filter((w) => w.sandboxId === sandboxId && !w.ended).length;
    if (mine >= MAX_WATCHERS_PER_SANDBOX || this.watchers.size >= MAX_WATCHERS) {
      throw new ForkdError(
        "too_many_requests",
        `too many watchers (at most ${MAX_WATCHERS_PER_SANDBOX} per sandbox): remove some with RemoveWatcher`,
      );
    }
    const id = randomUUID();
    const visible = uploadEventFilter();
    const watcher: Watcher = {
      sandboxId,
      path,
      includeEntry: options.includeEntry,
      events: [],
      dropped: 0,
      ended: undefined,
      handle: files.watch(sandboxId, path, {
        recursive: options.recursive,
        onEvent: (reported) => {
          for (const event of visible(reported)) {
            if (watcher.events.length >= MAX_KEPT_EVENTS) {
              watcher.events.shift();
              watcher.dropped++;
            }
            watcher.events.push(event);
          }
        },
      }),
    };
    watcher.handle.done.then(
      (end) => {
        watcher.ended = {
          atMs: Date.now(),
          reason: end.reason === "removed" ? "the directory was removed" : "stopped",
        };
      },
      (err: unknown) => {
        watcher.ended = { atMs: Date.now(), reason: errorMessage(err) };
      },
    );
    this.watchers.set(id, watcher);
    return id;
  }

  /** The events since the last poll (oldest first). A watcher that ended and has nothing left is not_found. */
  take(sandboxId: string, id: string): { path: string; includeEntry: boolean; events: FsEvent[] } {
    const watcher = this.mine(sandboxId, id);
    if (watcher.ended && watcher.events.length === 0) {
      this.watchers.delete(id);
      throw notFound(`watcher ${id} ended: ${watcher.ended.reason}`);
    }
    const events = watcher.events.splice(0);
    return { path: watcher.path, includeEntry: watcher.includeEntry, events };
  }

  async remove(sandboxId: string, id: string): Promise<void> {
    const watcher = this.mine(sandboxId, id);
    this.watchers.delete(id);
    await watcher.handle.stop().catch(() => {});
  }

  /** Stops every watch (the daemon is closing). */
  async closeAll(): Promise<void> {
    const all = [...this.watchers.values()];
    this.watchers.clear();
    await Promise.all(all.map((w) => w.handle.stop().catch(() => {})));
  }

  private mine(sandboxId: string, id: string): Watcher {
    const watcher = this.watchers.get(id);
    if (!watcher || watcher.sandboxId !== sandboxId)
      throw notFound(`watcher ${JSON.stringify(id)} not found`);
    return watcher;
  }

  private forgetEnded(): void {
    const now = Date.now();
    for (const [id, watcher] of this.watchers) {
      if (watcher.ended && now - watcher.ended.atMs > ENDED_TTL_MS) this.watchers.delete(id);
    }
  }
}
