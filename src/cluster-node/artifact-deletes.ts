/**
 * The registry artifacts of durable pauses this node is to delete (docs/kubernetes.md, "The durable pause"):
 * a pause pushed here whose sandbox resumed or was killed here, and a pause adopted here (`watch`) once its
 * sandbox is no longer paused here. A delete that fails (the registry down, deletes not enabled) is logged and
 * tried again every DELETE_RETRY_MS; nothing waits for it (a resume never does). The list is kept in a file,
 * replaced atomically, so a restart neither forgets an artifact nor deletes one twice on purpose. Every
 * reference is by digest (`host/forkd/paused/<id>@sha256:...`), made by this node from its own registry
 * setting, the sandbox id and a digest its seal verified: never a reference read from another node.
 */
import { readFile } from "node:fs/promises";
import type { Logger } from "pino";
import { replaceFile } from "../common/durable-fs.js";
import { errorMessage } from "../common/errors.js";

/** How often deletes that failed are tried again. */
export const DELETE_RETRY_MS = 30_000;
/** Bounds the file: a registry that refuses deletes for good must not grow it without end. */
const MAX_PENDING = 1024;

interface DeletesState {
  /** Adopted sandbox id -> its artifact: deleted once the sandbox is no longer paused here. */
  watch: Record<string, string>;
  /** Artifacts to delete, oldest first. */
  pending: string[];
}

export class ArtifactDeletes {
  private state: DeletesState = { watch: {}, pending: [] };
  private flushing: Promise<void> | undefined;
  private saving: Promise<void> = Promise.resolve();

  constructor(
    private readonly file: string,
    private readonly deleteArtifact: (reference: string) => Promise<void>,
    private readonly logger: Logger,
  ) {}

  async load(): Promise<void> {
    const text = await readFile(this.file, "utf8").catch(() => "{}");
    try {
      const read = JSON.parse(text) as Partial<DeletesState>;
      const strings = (list: unknown) =>
        Array.isArray(list) ? list.filter((r): r is string => typeof r === "string") : [];
      const watch: Record<string, string> = {};
      for (const [id, ref] of Object.entries(read.watch ?? {})) if (typeof ref === "string") watch[id] = ref;
      this.state = { watch, pending: strings(read.pending).slice(-MAX_PENDING) };
    } catch {
      this.state = { watch: {}, pending: [] };
    }
  }

  /** What is still to delete (for tests and logs). */
  get pending(): readonly string[] {
    return this.state.pending;
  }

  /** Adopted sandbox `id`'s artifact: deleted once `sweep` no longer finds it paused. */
  watch(id: string, reference: string): void {
    this.state.watch[id] = reference;
    this.save();
  }

  /** Queues the artifacts of watched sandboxes that are no longer paused here. */
  sweep(paused: ReadonlySet<string>): void {
    for (const [id, reference] of Object.entries(this.state.watch)) {
      if (paused.has(id)) continue;
      delete this.state.watch[id];
      this.enqueue(reference);
    }
  }

  /** Queues `reference` and tries it at once (in the background). */
  enqueue(reference: string): void {
    if (!this.state.pending.includes(reference)) {
      this.state.pending = [...this.state.pending, reference].slice(-MAX_PENDING);
    }
    this.save();
    void this.flush();
  }

  /** Tries every queued delete once; what fails stays queued (resolves when done, never rejects). */
  flush(): Promise<void> {
    this.flushing ??= this.flushOnce().finally(() => {
      this.flushing = undefined;
    });
    return this.flushing;
  }

  private async flushOnce(): Promise<void> {
    for (const reference of [...this.state.pending]) {
      try {
        await this.deleteArtifact(reference);
      } catch (err) {
        // A manifest already gone is what a delete wants (an earlier try that answered late, or an operator).
        if (!/manifest unknown|\b404\b/i.test(errorMessage(err))) {
          this.logger.warn(
            { reference, err: errorMessage(err) },
            "could not delete a durable pause's artifact from the registry; tried again later",
          );
          continue;
        }
      }
      this.state.pending = this.state.pending.filter((r) => r !== reference);
      this.save();
      this.logger.info({ reference }, "deleted a durable pause's artifact from the registry");
    }
  }

  /** Writes the state (one write at a time, in order; a failure is logged: the state is still in memory). */
  private save(): void {
    const text = JSON.stringify(this.state);
    this.saving = this.saving.then(async () => {
      try {
        await replaceFile(this.file, text);
      } catch (err) {
        this.logger.warn({ err: errorMessage(err) }, "could not save the registry deletes to do");
      }
    });
  }

  /** Resolves once every write so far is on disk. */
  saved(): Promise<void> {
    return this.saving;
  }
}
