/**
 * Calls from the gateway to one node through its SDK client (node-links.ts): every call carries the node's
 * current epoch and the tenant it acts for; a node's refusal comes back as the ForkdError of its status, with
 * the node's own message, so the gateway answers in the caller's API shape what the node said.
 */
import { CLUSTER_HEADERS } from "../cluster/protocol.js";
import { ERROR_CODES, type ErrorCode, ForkdError } from "../common/errors.js";
import { type Controller, ForkdSdkError } from "../sdk/index.js";
import type { NodeLinks } from "./node-links.js";

export interface NodeCall {
  method: "GET" | "POST" | "PUT" | "DELETE" | "PATCH";
  path: string;
  query?: Record<string, string | number | boolean | undefined>;
  json?: unknown;
  /** Deadline of the whole call (0: none); default the link's request timeout. */
  deadlineMs?: number;
}

/** Connection errors after which the request was certainly not delivered. */
const NOT_SENT = new Set(["ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH"]);

/** Whether a node call failed before it was delivered (a retry elsewhere cannot do the work twice). */
export function notDelivered(err: unknown): boolean {
  return err instanceof ForkdError && err.detail?.not_sent === true;
}

const CODE_BY_STATUS = new Map<number, ErrorCode>(
  Object.entries(ERROR_CODES).map(([code, status]) => [status, code as ErrorCode]),
);

/** What a node's refusal means here (a node that did not answer is unavailable). */
export function fromNodeError(node: string, err: unknown): unknown {
  if (err instanceof ForkdError) return err;
  if (err instanceof ForkdSdkError) {
    const status = err.status;
    if (status === undefined) {
      const syscall = (err as { syscallCode?: string }).syscallCode;
      return new ForkdError("unavailable", `node ${node} did not answer: ${err.message}`, {
        cause: err,
        // Refused before the request was sent: nothing happened there, the call may go elsewhere.
        detail: { node, not_sent: syscall !== undefined && NOT_SENT.has(syscall) },
      });
    }
    const code = CODE_BY_STATUS.get(status) ?? (status >= 500 ? "internal" : "invalid_argument");
    return new ForkdError(code, err.serverMessage || err.message, { cause: err, detail: { node } });
  }
  return err;
}

/**
 * The largest answer of a node the gateway reads into memory (a list of every sandbox of a full node is a few
 * MiB): a node's answer beyond it fails that call, never the gateway. Relayed calls are streamed, not bounded here.
 */
export const MAX_NODE_ANSWER_BYTES = 32 * 1024 * 1024;

export class NodeCaller {
  constructor(private readonly links: NodeLinks) {}

  /** The parsed JSON answer of `call` on `node`, acting for `tenant` (null: an admin). */
  async json<T>(node: string, call: NodeCall, tenant: string | null, signal?: AbortSignal): Promise<T> {
    const { client, request, options } = this.prepare(node, call, tenant, signal);
    try {
      return await client.json<T>(request, options);
    } catch (err) {
      throw fromNodeError(node, err);
    }
  }

  /** The whole answer of `call` on `node` (status, headers, body), for answers relayed as they are. */
  async send(
    node: string,
    call: NodeCall,
    tenant: string | null,
    signal?: AbortSignal,
  ): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: Buffer }> {
    const { client, request, options } = this.prepare(node, call, tenant, signal);
    try {
      return await client.send(request, options);
    } catch (err) {
      throw fromNodeError(node, err);
    }
  }

  /** The epoch calls to `node` carry now. */
  epochOf(node: string): number | undefined {
    return this.links.client(node)?.epoch;
  }

  private prepare(node: string, call: NodeCall, tenant: string | null, signal: AbortSignal | undefined) {
    const link = this.links.client(node);
    if (!link) throw new ForkdError("unavailable", `node ${node} is not reachable from this gateway now`);
    const headers: Record<string, string> = { [CLUSTER_HEADERS.epoch]: String(link.epoch) };
    if (tenant !== null) headers[CLUSTER_HEADERS.tenant] = tenant;
    const request: Parameters<Controller["send"]>[0] = {
      method: call.method,
      path: call.path,
      query: call.query,
      json: call.json,
      maxResponseBytes: MAX_NODE_ANSWER_BYTES,
      ...(call.deadlineMs === undefined ? {} : { deadlineMs: call.deadlineMs }),
    };
    return { client: link.client, request, options: { headers, signal } };
  }
}
