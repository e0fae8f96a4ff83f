/**
 * envd (port 49983) served in the daemon: the Process and Filesystem Connect services (JSON and binary,
 * unary and server-streaming, through connect-fastify), the file transfer routes, /health, /envs and /metrics.
 * Every request first names a running sandbox (else 502) and carries its access token (else 401); /health
 * needs no token (E2B's isRunning() probes it) and /files also takes a signed URL.
 */

import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import { fastifyConnectPlugin } from "@connectrpc/connect-fastify";
import type { FastifyInstance } from "fastify";
import { MAX_FILE_BYTES } from "../../agent/protocol/limits.js";
import { servicesOf } from "../../http/request-scope.js";
import type { E2bContext } from "../context.js";
import { sendConnectError, sendE2bError } from "../errors.js";
import { requireAccessToken, resolveSandbox } from "../session.js";
import { registerFileRoutes, resolveSignedFiles } from "./files-http.js";
import { filesystemService } from "./filesystem-service.js";
import { Filesystem } from "./gen/filesystem/filesystem_pb.js";
import { Process } from "./gen/process/process_pb.js";
import { processService } from "./process-service.js";
import { SERVICES_KEY, SESSION_KEY } from "./rpc-session.js";

/** Routes reachable without the access token: the health probe, and /files (it checks token or signature). */
const OPEN_ROUTES = new Set(["GET /health", "GET /files", "POST /files", "HEAD /health"]);

/** Largest Connect message envd takes (SendInput data travels in one agent frame). */
const MAX_CONNECT_MESSAGE_BYTES = MAX_FILE_BYTES;

const CONNECT_PATH = /^\/[A-Za-z_][\w.]*\.[A-Za-z_]\w*\/[A-Za-z_]\w*$/;

/**
 * `GET/POST /files` with a signature and no sandbox named (the SDKs' uploadUrl/downloadUrl on E2B_SANDBOX_URL):
 * envd's file routes for the sandbox whose envd token made the signature. Registered outside the data plane's
 * router constraint, since such a request addresses no sandbox.
 */
export async function registerSignedFiles(scope: FastifyInstance, context: E2bContext): Promise<void> {
  scope.addHook("onRoute", (route) => {
    route.config = { ...(route.config as object), e2b: true };
    route.schema = { ...route.schema, hide: true };
  });
  scope.addHook("onRequest", async (request) => {
    resolveSignedFiles(request as Parameters<typeof resolveSignedFiles>[0], context);
  });
  scope.setErrorHandler((err, _request, reply) => sendE2bError(reply, err));
  await registerFileRoutes(scope, context);
}

export async function registerEnvd(scope: FastifyInstance, context: E2bContext): Promise<void> {
  scope.addHook("onRequest", async (request) => {
    const session = resolveSandbox(request, context);
    const route = `${request.method} ${request.routeOptions.url ?? ""}`;
    if (!OPEN_ROUTES.has(route)) requireAccessToken(request, context, session);
  });
  scope.setErrorHandler((err, request, reply) => {
    if (request.routeOptions.config.connect) return sendConnectError(reply, err);
    return sendE2bError(reply, err);
  });

  await scope.register(async (rpc) => {
    rpc.addHook("onRoute", (route) => {
      route.config = { ...(route.config as object), connect: true };
    });
    // Connect reads its own request bodies (JSON included): the daemon's JSON parser must not consume them.
    rpc.removeContentTypeParser("application/json");
    await rpc.register(fastifyConnectPlugin, {
      routes: (router) => {
        router.service(Process, processService(context));
        router.service(Filesystem, filesystemService(context));
      },
      readMaxBytes: MAX_CONNECT_MESSAGE_BYTES,
      contextValues: (request) =>
        createContextValues().set(SESSION_KEY, request.e2bSandbox).set(SERVICES_KEY, servicesOf(request)),
    });
  });

  await registerFileRoutes(scope, context);

  scope.get("/health", async (_request, reply) => reply.status(204).send());

  scope.get("/envs", async (request) =>
    servicesOf(request).sandboxes.envVars(request.e2bSandbox?.sandboxId ?? ""),
  );

  scope.get("/metrics", async (request) => {
    const m = await servicesOf(request).sandboxes.metrics(request.e2bSandbox?.sandboxId ?? "");
    const mib = 1024 * 1024;
    return {
      ts: Math.floor(m.timestamp_unix_ms / 1000),
      cpu_count: m.cpu_count,
      cpu_used_pct: m.cpu_used_pct,
      mem_total: m.mem_total_bytes,
      mem_used: m.mem_used_bytes,
      mem_cache: m.mem_cache_bytes,
      mem_total_mib: Math.round(m.mem_total_bytes / mib),
      mem_used_mib: Math.round(m.mem_used_bytes / mib),
      disk_total: m.disk_total_bytes,
      disk_used: m.disk_used_bytes,
    };
  });

  // Anything else: an unknown Connect method is Connect's unimplemented (404), any other path envd's 404.
  scope.all("/*", async (request, reply) => {
    const route = request.url.split("?")[0] ?? "";
    if (request.method === "POST" && CONNECT_PATH.test(route)) {
      return sendConnectError(
        reply,
        new ConnectError(`no method ${route} in envd's services`, Code.Unimplemented),
      );
    }
    return sendE2bError(
      reply,
      Object.assign(new Error(`no route ${request.method} ${route} in envd`), { statusCode: 404 }),
    );
  });
}
