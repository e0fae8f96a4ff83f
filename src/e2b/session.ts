/**
 * A data-plane request's sandbox: which one it addresses (headers or host name), that it is running (else
 * E2B's 502), and that the request carries that sandbox's secret. One sandbox's token never opens another:
 * tokens are per sandbox and checked against the sandbox the request names.
 */
import type { IncomingHttpHeaders } from "node:http";
import type { FastifyRequest } from "fastify";
import { ForkdError } from "../common/errors.js";
import { isValidSandboxId } from "../common/names.js";
import type { AccessTokens } from "../controller/sandbox-service.js";
import type { E2bContext } from "./context.js";
import { SandboxUnreachable } from "./errors.js";
import { sandboxAddressOf } from "./routing.js";

export interface SandboxSession {
  sandboxId: string;
  port: number;
}

declare module "fastify" {
  interface FastifyRequest {
    /** Set by the data plane's hook once the sandbox is known to be running. */
    e2bSandbox?: SandboxSession;
  }
}

/** The running sandbox a data-plane request addresses; SandboxUnreachable (502) otherwise. */
export function resolveSandbox(request: FastifyRequest, context: E2bContext): SandboxSession {
  const session = sandboxSession(request.headers, context);
  request.e2bSandbox = session;
  request.caller = `sandbox:${session.sandboxId}`;
  request.auditIds.push(session.sandboxId);
  return session;
}

/** resolveSandbox for a request that never reaches a route (a WebSocket upgrade). */
export function sandboxSession(headers: IncomingHttpHeaders, context: E2bContext): SandboxSession {
  const address = sandboxAddressOf(headers);
  if (address === null) throw new ForkdError("invalid_argument", "no sandbox named (E2b-Sandbox-Id header)");
  const { sandboxId, port } = address;
  if (!isValidSandboxId(sandboxId)) {
    throw new SandboxUnreachable(`sandbox ${JSON.stringify(String(sandboxId).slice(0, 64))} not found`);
  }
  let status: string;
  try {
    status = context.services.sandboxes.get(sandboxId).status;
  } catch {
    throw new SandboxUnreachable(`sandbox ${sandboxId} not found`);
  }
  if (status !== "running") throw new SandboxUnreachable(`sandbox ${sandboxId} is not running (${status})`);
  return { sandboxId, port };
}

export function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** Where E2B clients send a sandbox's traffic access token (its ports, the interpreter's context routes). */
export const TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token";

/** Whether the request carries one of the sandbox's secrets of the kinds accepted. */
export function hasAccessToken(
  request: FastifyRequest,
  context: E2bContext,
  session: SandboxSession,
  accepted: readonly (keyof AccessTokens)[],
): boolean {
  const { sandboxes } = context.services;
  const presented: Record<keyof AccessTokens, string | undefined> = {
    envd: header(request.headers, "x-access-token"),
    traffic: header(request.headers, TRAFFIC_TOKEN_HEADER),
  };
  return accepted.some((kind) => sandboxes.verifyAccessToken(session.sandboxId, kind, presented[kind]));
}

export function requireAccessToken(
  request: FastifyRequest,
  context: E2bContext,
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
