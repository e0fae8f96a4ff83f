/**
 * A data-plane request's sandbox: which one it addresses (headers or host name), that it is running (else
 * E2B's 502), and that the request carries that sandbox's secret. One sandbox's token never opens another:
 * tokens are per sandbox and checked against the sandbox the request names.
 *
 * This is the data plane's authentication, the one place of src/e2b that holds the daemon's services as they are
 * (SandboxSessions, made by registerE2b): it finds the sandbox before anyone is known to act for it. The request
 * then acts within that one sandbox (its principal: the owner's tenant, confined to the sandbox), and its routes
 * see only that (servicesOf(request); controller/tenancy/sandbox-view.ts).
 */
import { timingSafeEqual } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import type { FastifyRequest } from "fastify";
import { ForkdError } from "../common/errors.js";
import { isValidSandboxId } from "../common/names.js";
import type { AccessTokens, SandboxService } from "../controller/sandbox-service.js";
import type { Principal } from "../controller/tenancy/tenant-view.js";
import { SandboxUnreachable } from "./errors.js";
import { ENVD_PORT, sandboxAddressOf } from "./routing.js";

export interface SandboxSession {
  sandboxId: string;
  port: number;
  /** Whom a request to it acts for: the sandbox's owner, confined to the sandbox. */
  principal: Principal;
}

declare module "fastify" {
  interface FastifyRequest {
    /** Set by the data plane's hook once the sandbox is known to be running. */
    e2bSandbox?: SandboxSession;
  }
}

/**
 * The data plane's authentication over the daemon's sandboxes (one per listener's E2B context): only what a
 * request's own headers name and carry is looked up, never handed out.
 */
export class SandboxSessions {
  readonly #sandboxes: SandboxService;

  constructor(sandboxes: SandboxService) {
    this.#sandboxes = sandboxes;
  }

  /** The running sandbox the headers address; SandboxUnreachable (502) otherwise. */
  session(headers: IncomingHttpHeaders): SandboxSession {
    const address = sandboxAddressOf(headers);
    if (address === null)
      throw new ForkdError("invalid_argument", "no sandbox named (E2b-Sandbox-Id header)");
    const { sandboxId, port } = address;
    if (!isValidSandboxId(sandboxId)) {
      throw new SandboxUnreachable(`sandbox ${JSON.stringify(String(sandboxId).slice(0, 64))} not found`);
    }
    let status: string;
    let wakes: boolean;
    let owner: string | null;
    try {
      const info = this.#sandboxes.get(sandboxId);
      status = info.status;
      wakes = info.auto_resume;
      owner = info.owner;
    } catch {
      throw new SandboxUnreachable(`sandbox ${sandboxId} not found`);
    }
    if (status === "paused") {
      throw new SandboxUnreachable(
        wakes
          ? `sandbox ${sandboxId} is paused: a request with one of its access tokens resumes it (autoResume), ` +
              "or connect to it"
          : `sandbox ${sandboxId} is paused: connect to it to resume it (it was created without autoResume)`,
      );
    }
    if (status !== "running") throw new SandboxUnreachable(`sandbox ${sandboxId} is not running (${status})`);
    return { sandboxId, port, principal: { tenant: owner, sandbox: sandboxId } };
  }

  /**
   * The running sandbox whose envd access token made `signature`, for a signed file URL that names no sandbox
   * (the SDKs build uploadUrl/downloadUrl on E2B_SANDBOX_URL, which carries no sandbox id; E2B routes them by
   * host name). `signatureFor(token)` is the signature that token would make for the request's path, operation,
   * user and expiration. A signature is a digest over the token, so it opens exactly what the token opens: the
   * session is the one a request with that sandbox's id and token gets (confined to the sandbox, acting for its
   * owner), never more. Every running sandbox's token is tried and each compared in constant time, so neither
   * which sandbox matched nor how much of a signature did shows in the time taken. undefined: none matched.
   */
  sessionBySignature(
    signature: string,
    signatureFor: (envdToken: string) => string,
  ): SandboxSession | undefined {
    const presented = Buffer.from(signature);
    let found: SandboxSession | undefined;
    for (const sandbox of this.#sandboxes.list({ status: "running" })) {
      const expected = Buffer.from(signatureFor(this.#sandboxes.accessTokens(sandbox.id).envd));
      const matches = presented.length === expected.length && timingSafeEqual(presented, expected);
      if (matches && found === undefined) {
        found = {
          sandboxId: sandbox.id,
          port: ENVD_PORT,
          principal: { tenant: sandbox.owner, sandbox: sandbox.id },
        };
      }
    }
    return found;
  }

  /** Whether the headers carry one of sandbox `sandboxId`'s secrets of the kinds accepted. */
  holdsToken(
    headers: IncomingHttpHeaders,
    sandboxId: string,
    accepted: readonly (keyof AccessTokens)[],
  ): boolean {
    const presented: Record<keyof AccessTokens, string | undefined> = {
      envd: header(headers, "x-access-token"),
      traffic: header(headers, TRAFFIC_TOKEN_HEADER),
    };
    return accepted.some((kind) => this.#sandboxes.verifyAccessToken(sandboxId, kind, presented[kind]));
  }

  /** See autoResume below. */
  async autoResume(headers: IncomingHttpHeaders): Promise<void> {
    const address = sandboxAddressOf(headers);
    if (address === null || !isValidSandboxId(address.sandboxId)) return;
    let info: ReturnType<SandboxService["get"]>;
    try {
      info = this.#sandboxes.get(address.sandboxId);
    } catch {
      return;
    }
    if (!info.auto_resume || !["paused", "pausing", "resuming"].includes(info.status)) return;
    // E2B's rule: a sandbox paused without memory resumes only by an explicit connect (a cold boot).
    if (info.paused_without_memory) return;
    if (!this.holdsToken(headers, address.sandboxId, ["envd", "traffic"])) return;
    try {
      await this.#sandboxes.resume(address.sandboxId, { timeoutMs: autoResumeLifetimeMs(info.timeout_ms) });
    } catch (err) {
      // Someone else's resume finished first: it is running, which is all this request needs.
      if (!(err instanceof ForkdError && err.code === "conflict")) throw err;
    }
  }
}

/** The shortest lifetime an auto-resumed sandbox gets (E2B's: five minutes, or its own when longer). */
export const AUTO_RESUME_MIN_LIFETIME_MS = 5 * 60_000;

/**
 * The lifetime of a sandbox auto-resumed by a request, from the resume on: its own (`timeout_ms`, null: none)
 * but at least AUTO_RESUME_MIN_LIFETIME_MS, as on E2B, so the work that woke it is not cut off by a short
 * lifetime ending again at once.
 */
export function autoResumeLifetimeMs(timeoutMs: number | null): number {
  return timeoutMs === null ? 0 : Math.max(timeoutMs, AUTO_RESUME_MIN_LIFETIME_MS);
}

/** What the functions below need of an E2B context. */
type WithSessions = { sessions: SandboxSessions };

/** The running sandbox a data-plane request addresses; SandboxUnreachable (502) otherwise. */
export function resolveSandbox(request: FastifyRequest, context: WithSessions): SandboxSession {
  const session = sandboxSession(request.headers, context);
  request.e2bSandbox = session;
  request.principal = session.principal;
  request.caller = `sandbox:${session.sandboxId}`;
  request.auditIds.push(session.sandboxId);
  return session;
}

/** resolveSandbox for a signed file URL that names no sandbox: see SandboxSessions.sessionBySignature. */
export function resolveSignedSandbox(
  request: FastifyRequest,
  context: WithSessions,
  signature: string,
  signatureFor: (envdToken: string) => string,
): SandboxSession | undefined {
  const session = context.sessions.sessionBySignature(signature, signatureFor);
  if (session === undefined) return undefined;
  request.e2bSandbox = session;
  request.principal = session.principal;
  request.caller = `sandbox:${session.sandboxId}`;
  request.auditIds.push(session.sandboxId);
  return session;
}

/** resolveSandbox for a request that never reaches a route (a WebSocket upgrade). */
export function sandboxSession(headers: IncomingHttpHeaders, context: WithSessions): SandboxSession {
  return context.sessions.session(headers);
}

/**
 * E2B's autoResume: a data-plane request to a paused sandbox created with it resumes the sandbox first (for its
 * own lifetime, at least five minutes: autoResumeLifetimeMs), then is served. Only a request carrying one of the sandbox's access tokens wakes it: anyone
 * who can reach the listener could otherwise make paused sandboxes take host memory again. A request that
 * finds it being paused or resumed waits for that to finish (the per-sandbox lock).
 */
export async function autoResume(request: HeadersOf, context: WithSessions): Promise<void> {
  await context.sessions.autoResume(request.headers);
}

export function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** Where E2B clients send a sandbox's traffic access token (its ports, the interpreter's context routes). */
export const TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token";

/** What the token checks read of a request: its headers (a route's request, or an upgrade's). */
type HeadersOf = { headers: IncomingHttpHeaders };

/** Whether the request carries one of the sandbox's secrets of the kinds accepted. */
export function hasAccessToken(
  request: HeadersOf,
  context: WithSessions,
  session: Pick<SandboxSession, "sandboxId">,
  accepted: readonly (keyof AccessTokens)[],
): boolean {
  return context.sessions.holdsToken(request.headers, session.sandboxId, accepted);
}

export function requireAccessToken(
  request: FastifyRequest,
  context: WithSessions,
  session: SandboxSession,
  accepted: readonly (keyof AccessTokens)[] = ["envd"],
): void {
  if (hasAccessToken(request, context, session, accepted)) return;
  const what = accepted.includes("envd") ? "X-Access-Token" : "E2B-Traffic-Access-Token";
  const sent = request.headers["x-access-token"] !== undefined || request.headers["e2b-traffic-access-token"];
  throw new ForkdError(
    "unauthorized",
    sent
      ? `unauthorized: the access token is not this sandbox's (${session.sandboxId})`
      : `unauthorized: send ${what}, the access token the sandbox was created with`,
  );
}

/** The user a Connect call names: envd takes it from `Authorization: Basic base64("<user>:")`. */
export function basicAuthUser(authorization: string | undefined): string | undefined {
  const match = /^Basic[ ]+([A-Za-z0-9+/=]+)$/i.exec(authorization ?? "");
  if (!match) return undefined;
  const decoded = Buffer.from(match[1] as string, "base64").toString("utf8");
  const user = decoded.split(":")[0];
  return user === "" ? undefined : user;
}
