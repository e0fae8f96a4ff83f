/**
 * The code interpreter (port 49999), as @e2b/code-interpreter calls it: `POST /execute` streams line-delimited
 * JSON events (stdout and stderr one line each, display outputs and the main result with text and the richer
 * formats the value offers, error, the execution count, end of execution) from a cell run in the sandbox's
 * warm interpreter (Python) or a context's bash or Node.js process, and `/contexts` manages its contexts. /execute needs the sandbox's envd access token; the context routes also take its traffic token
 * (the SDK sends only that one there); /health needs none. Errors are plain text, as E2B's server answers.
 */
import { PassThrough } from "node:stream";
import type { Static } from "@sinclair/typebox";
import { Type } from "@sinclair/typebox";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { ContextLanguage, DisplayData, EvalOutcome } from "../../agent/host/types.js";
import { ForkdError, invalidArgument } from "../../common/errors.js";
import { MAX_EVAL_CODE_CHARS, MAX_GUEST_TIMEOUT_MS, MAX_UNREAD_OUTPUT_BYTES } from "../../common/limits.js";
import { clientSignal, servicesOf } from "../../http/request-scope.js";
import type { E2bContext } from "../context.js";
import { Nullable, OptionalBody } from "../control/schemas.js";
import { toE2bError } from "../errors.js";
import { requireAccessToken, resolveSandbox, type SandboxSession } from "../session.js";

/** Where a new context starts when the caller names no directory (E2B's default). */
const DEFAULT_CONTEXT_CWD = "/home/user";

/**
 * E2B's server models (pydantic: `Optional[...] = None`) take null for every field but `code`, and the Python
 * SDK sends null for what the caller left out (`"context_id": null, "language": null, "env_vars": null`):
 * null means absent here.
 */
const ExecuteBody = Type.Object(
  {
    code: Type.String({ maxLength: MAX_EVAL_CODE_CHARS }),
    context_id: Type.Optional(Nullable(Type.String({ maxLength: 64 }))),
    language: Type.Optional(Nullable(Type.String({ maxLength: 32 }))),
    env_vars: Type.Optional(Nullable(Type.Record(Type.String(), Type.String()))),
  },
  { additionalProperties: true },
);
const CreateContextBody = Type.Object(
  {
    language: Type.Optional(Nullable(Type.String({ maxLength: 32 }))),
    cwd: Type.Optional(Nullable(Type.String({ maxLength: 4096 }))),
  },
  { additionalProperties: true },
);
const ContextParams = Type.Object({ id: Type.String({ maxLength: 64 }) });

/** E2B's language names (its SDKs' RunCodeLanguage) for the languages a forkd context runs. */
const LANGUAGES: Record<string, ContextLanguage> = {
  python: "python",
  bash: "bash",
  javascript: "javascript",
  js: "javascript",
};

function languageOf(language: string | null | undefined): ContextLanguage {
  if (language === undefined || language === null || language === "") return "python";
  const known = LANGUAGES[language.toLowerCase()];
  if (known !== undefined) return known;
  throw invalidArgument(
    `language ${JSON.stringify(language)}: forkd's code interpreter runs python, bash and javascript (js; where ` +
      "the template has node)",
  );
}

/** Cells of a language that name no context run in its default one, as in E2B (Python's is `default`). */
const defaultContextOf = (language: ContextLanguage) =>
  language === "python" ? undefined : `default-${language}`;

/**
 * E2B's result fields from a value's formats: E2B's server sends `json` and `chart` as objects, and a text that
 * is a quoted string without its quotes (its Result model strips them).
 */
export function e2bResult(text: string | null | undefined, formats: DisplayData | undefined): object {
  const { json, chart, text: displayText, ...rest } = formats ?? {};
  const plain = text ?? displayText;
  return {
    ...(plain !== undefined && plain !== null ? { text: unquoted(plain) } : {}),
    ...rest,
    ...(json !== undefined ? { json: parsedOr(json) } : {}),
    ...(chart !== undefined ? { chart: parsedOr(chart) } : {}),
  };
}

function unquoted(text: string): string {
  const quoted =
    text.length >= 2 &&
    ((text.startsWith("'") && text.endsWith("'")) || (text.startsWith('"') && text.endsWith('"')));
  return quoted ? text.slice(1, -1) : text;
}

function parsedOr(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** The NDJSON events of a finished cell (its output and display outputs were streamed while it ran). */
export function outcomeEvents(outcome: EvalOutcome): object[] {
  const events: object[] = [];
  if (outcome.result !== null || outcome.formats !== undefined) {
    events.push({ type: "result", ...e2bResult(outcome.result, outcome.formats), is_main_result: true });
  }
  if (outcome.error) {
    events.push({
      type: "error",
      name: outcome.error.type,
      value: outcome.error.message,
      traceback: outcome.error.traceback,
    });
  } else if (outcome.timedOut) {
    events.push({ type: "error", name: "TimeoutError", value: "the cell timed out", traceback: "" });
  }
  if (outcome.executionCount !== undefined) {
    events.push({ type: "number_of_executions", execution_count: outcome.executionCount });
  }
  events.push({ type: "end_of_execution" });
  return events;
}

const line = (event: object) => `${JSON.stringify(event)}\n`;

function sendPlainError(reply: FastifyReply, err: unknown): FastifyReply {
  const { code, message } = toE2bError(err);
  return reply.status(code).type("text/plain; charset=utf-8").send(message);
}

type ExecuteRoute = { Body: Static<typeof ExecuteBody> };
type CreateContextRoute = { Body: Static<typeof CreateContextBody> | undefined };
type ContextRoute = { Params: Static<typeof ContextParams> };

export async function registerInterpreter(scope: FastifyInstance, context: E2bContext): Promise<void> {
  scope.addHook("onRequest", async (request) => {
    const resolved = resolveSandbox(request, context);
    const route = request.routeOptions.url ?? "";
    if (route === "/health") return;
    requireAccessToken(request, context, resolved, route === "/execute" ? ["envd"] : ["envd", "traffic"]);
  });
  scope.setErrorHandler((err, _request, reply) => sendPlainError(reply, err));

  scope.get("/health", async () => "OK");
  scope.post<ExecuteRoute>("/execute", { schema: { body: ExecuteBody } }, execute);
  scope.get("/contexts", async (request, reply) =>
    servicesOf(request).sandboxes.contexts.list(sandboxOf(request), { signal: clientSignal(request, reply) }),
  );
  scope.post<CreateContextRoute>(
    "/contexts",
    { schema: { body: OptionalBody(CreateContextBody) } },
    createContext,
  );
  scope.delete<ContextRoute>("/contexts/:id", { schema: { params: ContextParams } }, removeContext);
  scope.post<ContextRoute>("/contexts/:id/restart", { schema: { params: ContextParams } }, restartContext);

  scope.all("/*", async (request) => {
    throw new ForkdError(
      "not_found",
      `no route ${request.method} ${request.url.split("?")[0]} in the code interpreter`,
    );
  });
}

/** The sandbox a request addresses (the data plane's hook resolved it). */
const sandboxOf = (request: FastifyRequest) => (request.e2bSandbox as SandboxSession).sandboxId;

/** POST /execute: the cell's output as NDJSON events while it runs, then its result. */
async function execute(request: FastifyRequest<ExecuteRoute>, reply: FastifyReply) {
  const body = request.body;
  const language = languageOf(body.language);
  const id = sandboxOf(request);
  const contextId = typeof body.context_id === "string" ? body.context_id : defaultContextOf(language);
  if (body.context_id === undefined || body.context_id === null) {
    await ensureDefaultContext(request, id, language, clientSignal(request, reply));
  }
  const out = new PassThrough();
  const cancel = new AbortController();
  const gone = clientSignal(request, reply);
  gone.addEventListener("abort", () => cancel.abort(gone.reason), { once: true });
  let sawOutput!: () => void;
  const firstOutput = new Promise<"output">((resolve) => {
    sawOutput = () => resolve("output");
  });
  const write = (event: object) => {
    if (out.destroyed || out.writableEnded) return;
    out.write(line(event));
    if (out.writableLength > MAX_UNREAD_OUTPUT_BYTES && !cancel.signal.aborted) {
      cancel.abort(
        new ForkdError(
          "unavailable",
          `client read too slowly (over ${MAX_UNREAD_OUTPUT_BYTES} bytes unread)`,
        ),
      );
    }
  };
  const emit = (type: "stdout" | "stderr", text: string) => {
    write({ type, text, timestamp: new Date().toISOString() });
    sawOutput();
  };
  const run = servicesOf(request).sandboxes.eval(id, body.code, {
    timeoutMs: MAX_GUEST_TIMEOUT_MS,
    ...(contextId !== undefined ? { context: contextId } : {}),
    ...(body.env_vars !== undefined && body.env_vars !== null ? { env: body.env_vars } : {}),
    onStdout: (text) => emit("stdout", text),
    onStderr: (text) => emit("stderr", text),
    onDisplay: (data) => {
      write({ type: "result", ...e2bResult(undefined, data), is_main_result: false });
      sawOutput();
    },
    signal: cancel.signal,
  });
  // The status line waits for the cell's first output or its end, so a cell refused at once (an unknown
  // context, a sandbox without an interpreter) gets its own status instead of a 200 stream.
  await Promise.race([firstOutput, run]);
  run
    .then(
      (outcome) => {
        for (const event of outcomeEvents(outcome)) write(event);
      },
      (err: unknown) => {
        const reason =
          cancel.signal.aborted && cancel.signal.reason instanceof ForkdError ? cancel.signal.reason : err;
        write({ type: "error", name: "ExecutionError", value: toE2bError(reason).message, traceback: "" });
      },
    )
    .finally(() => out.end());
  return reply.type("application/x-ndjson").header("cache-control", "no-store").send(out);
}

/** A language's default context, made on its first cell (a Python sandbox always has `default`). */
async function ensureDefaultContext(
  request: FastifyRequest,
  id: string,
  language: ContextLanguage,
  signal: AbortSignal,
): Promise<void> {
  const context = defaultContextOf(language);
  if (context === undefined) return;
  await servicesOf(request)
    .sandboxes.contexts.create(id, { id: context, language, signal })
    .catch((err: unknown) => {
      if (!(err instanceof ForkdError && err.code === "conflict")) throw err;
    });
}

async function createContext(request: FastifyRequest<CreateContextRoute>, reply: FastifyReply) {
  const language = languageOf(request.body?.language);
  const cwd = request.body?.cwd ?? DEFAULT_CONTEXT_CWD;
  if (!cwd.startsWith("/")) throw invalidArgument(`cwd must be an absolute path, got ${JSON.stringify(cwd)}`);
  return servicesOf(request).sandboxes.contexts.create(sandboxOf(request), {
    cwd,
    language,
    signal: clientSignal(request, reply),
  });
}

async function removeContext(request: FastifyRequest<ContextRoute>, reply: FastifyReply) {
  await servicesOf(request).sandboxes.contexts.remove(sandboxOf(request), request.params.id, {
    signal: clientSignal(request, reply),
  });
  return reply.status(204).send();
}

async function restartContext(request: FastifyRequest<ContextRoute>, reply: FastifyReply) {
  await servicesOf(request).sandboxes.contexts.restart(sandboxOf(request), request.params.id, {
    signal: clientSignal(request, reply),
  });
  return reply.status(204).send();
}
