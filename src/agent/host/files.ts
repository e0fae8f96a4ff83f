/** The file ops of AgentClient (`client.files`): read, write, list, stat, remove, mkdir, move, watch. */
import { ForkdError } from "../../common/errors.js";
import {
  type EventHeader,
  MAX_FILE_BYTES,
  MAX_QUEUED_WATCH_EVENTS,
  type OpArgs,
  type OpResult,
} from "../protocol/index.js";
import { AsyncQueue } from "./async-queue.js";
import type { AgentConnection } from "./connection.js";
import type {
  AgentFiles,
  CallOptions,
  FileInfo,
  FileWriteOptions,
  FsEvent,
  WatchEnd,
  WatchHandle,
  WatchOptions,
} from "./types.js";

const DEFAULT_READ_BYTES = MAX_FILE_BYTES;

/** `client.files` over one connection. */
export function agentFiles(connection: AgentConnection): AgentFiles {
  const call = connection.call.bind(connection);
  return {
    write: (path, data, options = {}) => fileWrite(connection, path, data, options),
    read: (path, options = {}) => fileRead(connection, path, options),
    list: async (path, options = {}) => {
      const args: OpArgs<"file.list"> = { path };
      if (options.maxEntries !== undefined) args.max_entries = options.maxEntries;
      if (options.depth !== undefined) args.depth = options.depth;
      const { result } = await call("file.list", args, undefined, options.signal);
      return { entries: result.entries.map(toFileInfo), truncated: result.truncated };
    },
    stat: async (path, options = {}) =>
      toFileInfo((await call("file.stat", { path }, undefined, options.signal)).result),
    remove: async (path, options = {}) => {
      await call("file.remove", { path, recursive: options.recursive === true }, undefined, options.signal);
    },
    mkdir: async (path, options = {}) => {
      const args: OpArgs<"file.mkdir"> = { path };
      if (options.parents !== undefined) args.parents = options.parents;
      if (options.mode !== undefined) args.mode = options.mode;
      if (options.user !== undefined) args.user = options.user;
      const { result } = await call("file.mkdir", args, undefined, options.signal);
      return { created: result.created, entry: toFileInfo(result.entry) };
    },
    move: async (source, destination, options = {}) => {
      const args: OpArgs<"file.move"> = { source, destination };
      if (options.user !== undefined) args.user = options.user;
      return toFileInfo((await call("file.move", args, undefined, options.signal)).result);
    },
    watch: (path, options = {}) => watch(connection, path, options),
  };
}

function toFileInfo(info: OpResult<"file.stat">): FileInfo {
  const out: FileInfo = {
    name: info.name,
    type: info.type,
    size: info.size,
    mode: info.mode,
    mtimeMs: info.mtime_ms,
  };
  if (info.link_target !== undefined) out.linkTarget = info.link_target;
  if (info.path !== undefined) out.path = info.path;
  if (info.uid !== undefined) out.uid = info.uid;
  if (info.gid !== undefined) out.gid = info.gid;
  if (info.owner !== undefined) out.owner = info.owner;
  if (info.group !== undefined) out.group = info.group;
  return out;
}

async function fileWrite(
  connection: AgentConnection,
  path: string,
  data: Buffer | string,
  options: FileWriteOptions,
): Promise<{ bytes: number }> {
  const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
  if (bytes.length > MAX_FILE_BYTES) {
    throw new ForkdError(
      "payload_too_large",
      `files.write ${path}: ${bytes.length} bytes exceeds the ${MAX_FILE_BYTES}-byte limit of one write`,
    );
  }
  const args: OpArgs<"file.write"> = { path };
  if (options.mode !== undefined) args.mode = options.mode;
  if (options.parents !== undefined) args.parents = options.parents;
  if (options.user !== undefined) args.user = options.user;
  if (options.append !== undefined) args.append = options.append;
  const { result } = await connection.call("file.write", args, bytes, options.signal);
  return { bytes: result.bytes };
}

async function fileRead(
  connection: AgentConnection,
  path: string,
  options: CallOptions & { maxBytes?: number; offset?: number },
) {
  const args: OpArgs<"file.read"> = { path, max_bytes: options.maxBytes ?? DEFAULT_READ_BYTES };
  if (options.offset !== undefined) args.offset = options.offset;
  const { result, body } = await connection.call("file.read", args, undefined, options.signal);
  if (body.length > args.max_bytes) {
    throw new ForkdError(
      "internal",
      `file.read ${path}: the guest sent ${body.length} bytes, more than asked`,
    );
  }
  return { data: body, size: result.size, truncated: result.truncated };
}

function watch(connection: AgentConnection, path: string, options: WatchOptions): WatchHandle {
  const limit = options.maxBufferedEvents ?? MAX_QUEUED_WATCH_EVENTS;
  const queue = new AsyncQueue<FsEvent>();
  let buffered = 0;
  let overflowed = false;
  let callId = 0;
  const onEvent = (event: EventHeader) => {
    if (event.ev !== "fs" || event.fs === undefined) {
      connection.violation("unexpected event for a watch call", { ev: event.ev });
      return;
    }
    const fsEvent: FsEvent = { name: event.fs.name, op: event.fs.op };
    options.onEvent?.(fsEvent);
    if (queue.abandoned || overflowed) return;
    if (++buffered > limit) {
      const error = new ForkdError("unavailable", `watch ${path}: more than ${limit} events were not read`);
      if (queue.active) {
        // A reader fell behind: the watch ends rather than buffering without bound.
        queue.fail(error);
        connection.cancel(callId);
      } else {
        // Nobody iterates (callbacks only): stop buffering for an iterator that may never come.
        overflowed = true;
        queue.discard(error);
      }
      return;
    }
    queue.push(fsEvent, () => {
      buffered--;
    });
  };
  const args: OpArgs<"watch"> = { path };
  if (options.recursive !== undefined) args.recursive = options.recursive;
  const { id, answer } = connection.start("watch", args, undefined, options.signal, {
    deadlineMs: null,
    onEvent,
  });
  callId = id;
  const done: Promise<WatchEnd> = answer.then(
    ({ result }) => {
      queue.end();
      return result;
    },
    (err: unknown) => {
      queue.fail(err instanceof Error ? err : new Error(String(err)));
      throw err;
    },
  );
  done.catch(() => {});
  let stopped = false;
  return {
    events: queue,
    done,
    stop: () => {
      if (!stopped && !connection.closed && connection.isPending(id)) {
        stopped = true;
        // After the cancel the guest owes the summary promptly.
        connection.setCallDeadline(id, connection.callTimeoutMs);
        connection.cancel(id);
      }
      return done;
    },
  };
}
