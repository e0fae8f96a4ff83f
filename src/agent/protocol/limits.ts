/**
 * Versions and hard limits of the agent protocol. Both ends enforce them; the host enforces them on everything
 * the guest sends because the guest runs user code and is hostile by assumption. The ones that callers of the
 * API see as well (a call's longest timeout, the longest path, the patterns of tags and sandbox ids the guest
 * checks) come from the table of src/common/limits.ts; the generator writes them into the Go side too.
 */
import {
  MAX_GUEST_TIMEOUT_MS,
  MAX_PATH_CHARS,
  SANDBOX_ID_PATTERN,
  TAG_PATTERN,
} from "../../common/limits.js";

export { MAX_PATH_CHARS, SANDBOX_ID_PATTERN, TAG_PATTERN };

/**
 * Bumped on any change an older peer would misread. Additive changes (a new op, a new optional result field)
 * keep the version: hosts gate on it through the hello/ping `protocol` field.
 */
export const PROTOCOL_VERSION = 2;

/**
 * First four bytes of every frame. 0xFD never occurs in UTF-8, so the magic cannot appear inside a JSON header;
 * after stray bytes (a frame cut by a reconnect, a restored guest's stale output) a reader resynchronises by
 * scanning for it.
 */
export const FRAME_MAGIC = Buffer.from([0xfd, 0x46, 0x4b, 0x44]);

/** magic (4) + frame length u32be (4) + header length u32be (4). */
export const FRAME_PREFIX_BYTES = 12;

/** Largest frame, prefix included: bounds what either side buffers for one message. */
export const MAX_FRAME_BYTES = 16 * 1024 * 1024;

/** Largest JSON header. Anything large (file data, code, big results) travels in the body instead. */
export const MAX_HEADER_BYTES = 64 * 1024;

/** Request ids are positive 31-bit integers chosen by the host; 0 is never used. */
export const MAX_ID = 2 ** 31 - 1;

/** Largest file payload of one file.write / file.read: leaves room for any header inside MAX_FRAME_BYTES. */
export const MAX_FILE_BYTES = MAX_FRAME_BYTES - 2 * MAX_HEADER_BYTES;

/** Calls the agent runs at once; more get `too_many_requests` instead of unbounded queues in the guest. */
export const MAX_IN_FLIGHT = 256;

/** Stdin bytes the host may send ahead of the guest's acknowledgements (`stdin_ack` events). */
export const STDIN_WINDOW_BYTES = 1024 * 1024;

/** Size of one stdin `in` frame the host sends. */
export const STDIN_CHUNK_BYTES = 256 * 1024;

/** Stdin up to this size rides in the exec request's body instead of separate `in` frames. */
export const STDIN_INLINE_BYTES = 1024 * 1024;

/** Captured eval stdout/stderr per stream, and the repr of the result, in characters. */
export const MAX_EVAL_OUTPUT_CHARS = 1024 * 1024;

/** Longest traceback an eval result carries, in characters. */
export const MAX_TRACEBACK_CHARS = 64 * 1024;

/** Upper bound of every op's timeout_ms. */
export const MAX_TIMEOUT_MS = MAX_GUEST_TIMEOUT_MS;

/** Entries one file.list returns at most (the result says when it was truncated). */
export const MAX_LIST_ENTRIES = 10_000;

/** Result JSON above this size is sent in the body (see `result_in_body`) so headers stay small. */
export const RESULT_IN_BODY_THRESHOLD = 16 * 1024;

/** Longest error message either side puts on the wire; longer ones are cut. */
export const MAX_ERROR_MESSAGE_CHARS = 4096;

/** Entropy a `restore` may carry, in bytes. */
export const MIN_ENTROPY_BYTES = 32;
export const MAX_ENTROPY_BYTES = 4096;

/** Deepest file.list a caller may ask for. */
export const MAX_LIST_DEPTH = 32;

/** Processes the agent's table holds at once (running or exited and not yet seen); more are `too_many_requests`. */
export const MAX_PROCS = 1024;

/** Exit records of processes nobody has seen end, kept at most (oldest dropped first). */
export const MAX_EXITED_PROCS = 256;

/** Watch events queued for a host that has not read them; beyond this they are counted and dropped. */
export const MAX_QUEUED_WATCH_EVENTS = 4096;

/** Output a process may have queued for the host before the agent stops reading its pipes or terminal. */
export const MAX_QUEUED_OUTPUT_BYTES = 4 * 1024 * 1024;
