/**
 * The header kinds of the agent protocol (field `t`), as typebox schemas both ends validate against.
 * Host -> guest: req, in, cancel. Guest -> host: hello, res, evt.
 */
import { type Static, Type } from "@sinclair/typebox";
import { ERROR_CODES, type ErrorCode, invalidArgument } from "../../common/errors.js";
import type { Frame } from "./frame.js";
import { MAX_ERROR_MESSAGE_CHARS, MAX_ID } from "./limits.js";
import { validator } from "./validate.js";

export const CallId = Type.Integer({ minimum: 1, maximum: MAX_ID });

export const WarmState = Type.Union([
  Type.Literal("cold"),
  Type.Literal("warming"),
  Type.Literal("warm"),
  Type.Literal("failed"),
]);
export type WarmState = Static<typeof WarmState>;

export const Interpreter = Type.Union([Type.Literal("python"), Type.Literal("none")]);
export type Interpreter = Static<typeof Interpreter>;

/** Sent by the agent, unsolicited, whenever it (re)opens its end of the channel. */
export const HelloHeader = Type.Object({
  t: Type.Literal("hello"),
  protocol: Type.Integer({ minimum: 0 }),
  agent_version: Type.String({ maxLength: 64 }),
  template: Type.String({ maxLength: 128 }),
  interpreter: Interpreter,
  warm: WarmState,
  sandbox_id: Type.Union([Type.String({ maxLength: 64 }), Type.Null()]),
});
export type HelloHeader = Static<typeof HelloHeader>;

export const RequestHeader = Type.Object({
  t: Type.Literal("req"),
  id: CallId,
  op: Type.String({ minLength: 1, maxLength: 64 }),
  args: Type.Optional(Type.Unknown()),
});
export type RequestHeader = Static<typeof RequestHeader>;

export const WireError = Type.Object({
  code: Type.String({ maxLength: 64 }),
  message: Type.String({ maxLength: 2 * MAX_ERROR_MESSAGE_CHARS }),
});
export type WireError = Static<typeof WireError>;

export const ResponseHeader = Type.Union([
  Type.Object({
    t: Type.Literal("res"),
    id: CallId,
    ok: Type.Literal(true),
    result: Type.Optional(Type.Unknown()),
    /** The result is the body's UTF-8 JSON instead of `result` (only for ops whose response has no binary body). */
    result_in_body: Type.Optional(Type.Boolean()),
  }),
  Type.Object({ t: Type.Literal("res"), id: CallId, ok: Type.Literal(false), error: WireError }),
]);
export type ResponseHeader = Static<typeof ResponseHeader>;

export const EventKind = Type.Union([
  Type.Literal("stdout"),
  Type.Literal("stderr"),
  Type.Literal("stdin_ack"),
  Type.Literal("pty"),
  Type.Literal("started"),
  Type.Literal("fs"),
  Type.Literal("display"),
]);
export type EventKind = Static<typeof EventKind>;

/** What changed under a watched directory: `name` is relative to the watched path. */
export const FsEvent = Type.Object({
  name: Type.String({ maxLength: 4096 }),
  op: Type.Union([
    Type.Literal("create"),
    Type.Literal("write"),
    Type.Literal("remove"),
    Type.Literal("rename"),
    Type.Literal("chmod"),
  ]),
});

/**
 * Something a running call produced before its answer:
 * - `stdout`/`stderr`/`pty`: output bytes in the body (eval: UTF-8 text);
 * - `stdin_ack`: `bytes` of stdin the process consumed (the host's send window);
 * - `started`: a proc.start/proc.connect call's process, `pid`;
 * - `fs`: a watch's change, `fs`;
 * - `display`: a streaming eval's display output (`display(value)`, a figure at the end of the cell): the
 *   body is a UTF-8 JSON DisplayData (protocol/ops.ts).
 */
export const EventHeader = Type.Object({
  t: Type.Literal("evt"),
  id: CallId,
  ev: EventKind,
  bytes: Type.Optional(Type.Integer({ minimum: 0, maximum: 2 ** 32 })),
  pid: Type.Optional(Type.Integer({ minimum: 1, maximum: 2 ** 22 })),
  fs: Type.Optional(FsEvent),
});
export type EventHeader = Static<typeof EventHeader>;

/** Stdin for a running call (body = bytes); `eof` closes it. */
export const InputHeader = Type.Object({
  t: Type.Literal("in"),
  id: CallId,
  eof: Type.Optional(Type.Boolean()),
});
export type InputHeader = Static<typeof InputHeader>;

export const CancelHeader = Type.Object({ t: Type.Literal("cancel"), id: CallId });
export type CancelHeader = Static<typeof CancelHeader>;

export type HostMessage = RequestHeader | InputHeader | CancelHeader;
export type GuestMessage = HelloHeader | ResponseHeader | EventHeader;

const hostValidators = {
  req: validator(RequestHeader),
  in: validator(InputHeader),
  cancel: validator(CancelHeader),
};
const guestValidators = {
  hello: validator(HelloHeader),
  res: validator(ResponseHeader),
  evt: validator(EventHeader),
};

/** Compiles the validators of host messages now (see Validator.compile). */
export function precompileHostMessages(): void {
  for (const check of Object.values(hostValidators)) check.compile();
}

/**
 * The header's kind. The frame decoder only passes headers whose `t` is a string; a caller that builds frames
 * itself gets the same guarantee here rather than a TypeError (found by test/fuzz/messages.test.ts).
 */
function messageKind(frame: Frame): string {
  const t: unknown = frame.header.t;
  return typeof t === "string" ? t : (JSON.stringify(t) ?? String(t));
}

/** Validates a header the guest received. Throws `invalid_argument` naming the kind and the bad field. */
export function parseHostMessage(frame: Frame): HostMessage {
  const kind = messageKind(frame);
  const check = hostValidators[kind as keyof typeof hostValidators];
  if (!Object.hasOwn(hostValidators, kind) || check === undefined) {
    throw invalidArgument(`unknown host message kind ${JSON.stringify(kind.slice(0, 32))}`);
  }
  return check.assert(frame.header, `${frame.header.t} header`);
}

/** Validates a header the host received from the (untrusted) guest. */
export function parseGuestMessage(frame: Frame): GuestMessage {
  const kind = messageKind(frame);
  const check = guestValidators[kind as keyof typeof guestValidators];
  if (!Object.hasOwn(guestValidators, kind) || check === undefined) {
    throw invalidArgument(`unknown guest message kind ${JSON.stringify(kind.slice(0, 32))}`);
  }
  return check.assert(frame.header, `${frame.header.t} header`);
}

/** A catalogue code for a code string that came off the wire; anything unknown becomes `internal`. */
export function wireErrorCode(code: string): ErrorCode {
  return Object.hasOwn(ERROR_CODES, code) ? (code as ErrorCode) : "internal";
}

/** Cuts a message to the wire limit, marking the cut. */
export function boundMessage(message: string): string {
  if (message.length <= MAX_ERROR_MESSAGE_CHARS) return message;
  return `${message.slice(0, MAX_ERROR_MESSAGE_CHARS - 14)} …(truncated)`;
}
