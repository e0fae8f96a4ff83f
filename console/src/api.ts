/**
 * The REST calls the console makes (src/console/protocol.ts lists them; the daemon accepts the session cookie on
 * those only). State-changing calls carry the session's CSRF token. Errors keep the daemon's message and code.
 */
import { CONSOLE_API, type ConsoleSession, CSRF_HEADER } from "../../src/console/protocol.js";

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

let csrf: string | null = null;
let onUnauthorized: () => void = () => {};

export function setCsrf(token: string | null): void {
  csrf = token;
}

/** Called when the daemon answers 401 (the session ended): the page goes back to the login form. */
export function whenUnauthorized(handler: () => void): void {
  onUnauthorized = handler;
}

/** Sends a request; a non-2xx answer becomes an ApiError with the daemon's message and code. */
async function request(method: string, path: string, body?: unknown): Promise<Response> {
  const headers: Record<string, string> = { accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  if (method !== "GET" && csrf !== null) headers[CSRF_HEADER] = csrf;
  let response: Response;
  try {
    response = await fetch(path, {
      method,
      headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(0, "unavailable", `the daemon did not answer: ${(err as Error).message}`);
  }
  if (response.ok) return response;
  const error = parseJson(await response.text()) as { error?: unknown; code?: unknown } | undefined;
  const message = typeof error?.error === "string" ? error.error : `HTTP ${response.status}`;
  const code = typeof error?.code === "string" ? error.code : "unknown";
  if (response.status === 401 && !path.startsWith(`${CONSOLE_API}/login`)) onUnauthorized();
  throw new ApiError(response.status, code, message);
}

function parseJson(text: string): unknown {
  try {
    return text === "" ? undefined : JSON.parse(text);
  } catch {
    return undefined;
  }
}

export async function call<T>(method: string, path: string, body?: unknown): Promise<T> {
  const response = await request(method, path, body);
  if (response.status === 204) return undefined as T;
  return parseJson(await response.text()) as T;
}

export const session = {
  get: () => call<ConsoleSession>("GET", `${CONSOLE_API}/session`),
  login: (token: string) => call<ConsoleSession>("POST", `${CONSOLE_API}/login`, { token }),
  logout: () => call<void>("POST", `${CONSOLE_API}/logout`),
};

const sandbox = (id: string) => `/v1/sandboxes/${encodeURIComponent(id)}`;

export interface EvalResult {
  result: string | null;
  error: string | null;
  stdout: string;
  stderr: string;
  duration_ms: number;
  timed_out: boolean;
}

export interface BranchResult {
  tag: string;
  mode: string;
  pause_ms: number;
  bytes_written: number;
}

export interface ForkResult {
  snapshot_tag: string;
  pause_ms: number;
  children: { sandbox: { id: string } | null; error: { error: string; code: string } | null }[];
}

export const actions = {
  spawn: (snapshotTag: string, n: number) =>
    call<{ id: string }[]>("POST", "/v1/sandboxes", { snapshot_tag: snapshotTag, n }),
  kill: (id: string) => call<void>("DELETE", sandbox(id)),
  setTimeout: (id: string, timeoutMs: number) =>
    call<unknown>("POST", `${sandbox(id)}/timeout`, { timeout_ms: timeoutMs }),
  eval: (id: string, code: string) => call<EvalResult>("POST", `${sandbox(id)}/eval`, { code }),
  branch: (id: string, body: { mode: string; tag?: string }) =>
    call<BranchResult>("POST", `${sandbox(id)}/branch`, body),
  fork: (id: string, count: number) => call<ForkResult>("POST", `${sandbox(id)}/fork`, { count }),
  pause: (id: string) => call<unknown>("POST", `${sandbox(id)}/pause`),
  resume: (id: string) => call<unknown>("POST", `${sandbox(id)}/resume`),
};

export interface FileEntry {
  name: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  link_target: string | null;
}

/** What the file viewer shows of one file; the rest is left in the sandbox. */
export const MAX_VIEWED_FILE_BYTES = 256 * 1024;

export const files = {
  list: (id: string, path: string) =>
    call<{ path: string; entries: FileEntry[]; truncated: boolean }>(
      "GET",
      `${sandbox(id)}/files/list?path=${encodeURIComponent(path)}`,
    ),
  /** A file's first MAX_VIEWED_FILE_BYTES as text (invalid UTF-8 shown as U+FFFD). */
  read: async (id: string, path: string) => {
    const response = await request("GET", `${sandbox(id)}/files?path=${encodeURIComponent(path)}`);
    const bytes = new Uint8Array(await response.arrayBuffer());
    const shown = bytes.subarray(0, MAX_VIEWED_FILE_BYTES);
    return {
      text: new TextDecoder().decode(shown),
      bytes: bytes.length,
      truncated: shown.length < bytes.length,
    };
  },
};
