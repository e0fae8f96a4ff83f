/**
 * envd's Filesystem service (filesystem.proto) over the sandbox's agent. Paths resolve as envd's do (relative to
 * the user's home, `~` expanded); errors carry envd's codes (NotFound -> the SDK's FileNotFoundError,
 * AlreadyExists -> makeDir() false, InvalidArgument for a path of the wrong kind).
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import type { FileInfo, FsEvent, FsOp } from "../../agent/host/types.js";
import { MAX_LIST_DEPTH } from "../../agent/protocol/limits.js";
import { ForkdError } from "../../common/errors.js";
import type { SandboxService } from "../../controller/sandbox-service.js";
import type { E2bContext } from "../context.js";
import { toConnectError } from "../errors.js";
import { entryInfo } from "./entry-info.js";
import { EventType, type Filesystem, type FilesystemEventSchema } from "./gen/filesystem/filesystem_pb.js";
import type { GuestUser } from "./guest-users.js";
import { KEEPALIVE, keepaliveIntervalMs, withKeepalives } from "./keepalive.js";
import { resolveGuestPath } from "./paths.js";
import { callUser, servicesOfCall, sessionOf } from "./rpc-session.js";
import { uploadEventFilter } from "./upload-names.js";

type SandboxFiles = SandboxService["files"];

const EVENT_TYPES: Record<FsOp, EventType> = {
  create: EventType.CREATE,
  write: EventType.WRITE,
  remove: EventType.REMOVE,
  rename: EventType.RENAME,
  chmod: EventType.CHMOD,
};

async function guarded<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw toConnectError(err);
  }
}

function isCode(err: unknown, code: ForkdError["code"]): boolean {
  return err instanceof ForkdError && err.code === code;
}

type FilesystemImpl = ServiceImpl<typeof Filesystem>;
type RequestOf<M extends keyof FilesystemImpl> = Parameters<FilesystemImpl[M]>[0];

export function filesystemService(context: E2bContext): FilesystemImpl {
  return {
    stat: (request, ctx) => stat(context, request, ctx),
    makeDir: (request, ctx) => makeDir(context, request, ctx),
    move: (request, ctx) => move(context, request, ctx),
    listDir: (request, ctx) => listDir(context, request, ctx),
    remove: (request, ctx) => remove(context, request, ctx),
    watchDir: (request, ctx) => watchDir(context, request, ctx),
    createWatcher: (request, ctx) => createWatcher(context, request, ctx),
    getWatcherEvents: (request, ctx) => getWatcherEvents(context, request, ctx),
    removeWatcher: (request, ctx) => removeWatcher(context, request, ctx),
  };
}

/** The call's sandbox's files, as its caller's view of the services (that one sandbox) reaches them. */
const filesOf = (ctx: HandlerContext) => servicesOfCall(ctx).sandboxes.files;

/** The call's sandbox, user and resolved path, and its files. */
async function target(context: E2bContext, ctx: HandlerContext, requested: string) {
  const session = sessionOf(ctx);
  const user = await callUser(context, ctx);
  return { id: session.sandboxId, user, path: guardedPath(requested, user), files: filesOf(ctx) };
}

/** A directory to watch: it must exist (NotFound) and be a directory (InvalidArgument), as in envd. */
async function watchable(id: string, path: string, ctx: HandlerContext): Promise<void> {
  const info = await guarded(() => filesOf(ctx).stat(id, path, { signal: ctx.signal }));
  if (info.type !== "dir") throw new ConnectError(`path ${path} is not a directory`, Code.InvalidArgument);
}

async function fsEvent(
  files: SandboxFiles,
  id: string,
  root: string,
  event: FsEvent,
  includeEntry: boolean,
): Promise<MessageInitShape<typeof FilesystemEventSchema>> {
  const message: MessageInitShape<typeof FilesystemEventSchema> = {
    name: event.name,
    type: EVENT_TYPES[event.op],
  };
  if (includeEntry && event.op !== "remove") {
    const full = `${root.replace(/\/$/, "")}/${event.name}`;
    const info = await files.stat(id, full).catch(() => null);
    if (info) message.entry = entryInfo(info, full);
  }
  return message;
}

async function stat(context: E2bContext, request: RequestOf<"stat">, ctx: HandlerContext) {
  const { id, path, files } = await target(context, ctx, request.path);
  const info = await guarded(() => files.stat(id, path, { signal: ctx.signal }));
  return { entry: entryInfo(info, path) };
}

async function makeDir(context: E2bContext, request: RequestOf<"makeDir">, ctx: HandlerContext) {
  const { id, user, path, files } = await target(context, ctx, request.path);
  const made = await guarded(() =>
    files.mkdir(id, path, { parents: true, user: user.name, signal: ctx.signal }),
  );
  if (!made.created) {
    if (made.entry.type === "dir") {
      throw new ConnectError(`directory already exists: ${path}`, Code.AlreadyExists);
    }
    throw new ConnectError(`path already exists but it is not a directory: ${path}`, Code.InvalidArgument);
  }
  return { entry: entryInfo(made.entry, path) };
}

async function move(context: E2bContext, request: RequestOf<"move">, ctx: HandlerContext) {
  const { id, user, path: source, files } = await target(context, ctx, request.source);
  const destination = guardedPath(request.destination, user);
  const moved = await guarded(() =>
    files.move(id, source, destination, { user: user.name, signal: ctx.signal }),
  );
  return { entry: entryInfo(moved, destination) };
}

async function listDir(context: E2bContext, request: RequestOf<"listDir">, ctx: HandlerContext) {
  const { id, path, files } = await target(context, ctx, request.path);
  const depth = request.depth === 0 ? 1 : request.depth;
  if (depth > MAX_LIST_DEPTH) {
    throw new ConnectError(
      `depth ${depth} is deeper than forkd lists (${MAX_LIST_DEPTH})`,
      Code.InvalidArgument,
    );
  }
  const listing = await guarded(async () => {
    const info = await files.stat(id, path, { signal: ctx.signal });
    if (info.type !== "dir" && info.type !== "symlink") {
      throw new ConnectError(`path is not a directory: ${path}`, Code.InvalidArgument);
    }
    return files.list(id, path, { depth, signal: ctx.signal });
  });
  if (listing.truncated) {
    throw new ConnectError(
      `${path} has more entries within depth ${depth} than one listing holds: list a subdirectory or less deep`,
      Code.FailedPrecondition,
    );
  }
  const base = path.replace(/\/$/, "");
  return { entries: listing.entries.map((e: FileInfo) => entryInfo(e, `${base}/${e.name}`)) };
}

async function remove(context: E2bContext, request: RequestOf<"remove">, ctx: HandlerContext) {
  const { id, path, files } = await target(context, ctx, request.path);
  try {
    await files.remove(id, path, { recursive: true, signal: ctx.signal });
  } catch (err) {
    // envd removes with RemoveAll: a path that is already gone is not an error.
    if (!isCode(err, "not_found")) throw toConnectError(err);
  }
  return {};
}

async function* watchDir(context: E2bContext, request: RequestOf<"watchDir">, ctx: HandlerContext) {
  const { id, path, files } = await target(context, ctx, request.path);
  await watchable(id, path, ctx);
  const handle = files.watch(id, path, { recursive: request.recursive, signal: ctx.signal });
  const visible = uploadEventFilter();
  yield { event: { case: "start" as const, value: {} } };
  try {
    for await (const item of withKeepalives(handle.events, keepaliveIntervalMs(ctx.requestHeader))) {
      if (item === KEEPALIVE) {
        yield { event: { case: "keepalive" as const, value: {} } };
        continue;
      }
      for (const shown of visible(item)) {
        const event = await fsEvent(files, id, path, shown, request.includeEntry);
        yield { event: { case: "filesystem" as const, value: event } };
      }
    }
  } catch (err) {
    throw toConnectError(err);
  } finally {
    await handle.stop().catch(() => {});
  }
}

async function createWatcher(context: E2bContext, request: RequestOf<"createWatcher">, ctx: HandlerContext) {
  const { id, path, files } = await target(context, ctx, request.path);
  await watchable(id, path, ctx);
  const watcherId = await guarded(async () =>
    context.watchers.create(files, id, path, {
      recursive: request.recursive,
      includeEntry: request.includeEntry,
    }),
  );
  return { watcherId };
}

async function getWatcherEvents(
  context: E2bContext,
  request: RequestOf<"getWatcherEvents">,
  ctx: HandlerContext,
) {
  const session = sessionOf(ctx);
  const taken = await guarded(async () => context.watchers.take(session.sandboxId, request.watcherId));
  const events = await Promise.all(
    taken.events.map((e) => fsEvent(filesOf(ctx), session.sandboxId, taken.path, e, taken.includeEntry)),
  );
  return { events };
}

async function removeWatcher(context: E2bContext, request: RequestOf<"removeWatcher">, ctx: HandlerContext) {
  const session = sessionOf(ctx);
  await guarded(() => context.watchers.remove(session.sandboxId, request.watcherId));
  return {};
}

function guardedPath(requested: string, user: GuestUser): string {
  try {
    return resolveGuestPath(requested, user);
  } catch (err) {
    throw toConnectError(err);
  }
}
