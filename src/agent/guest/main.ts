/**
 * Entry point of the guest agent (bundled to /opt/forkd/agent.mjs, run by tini as PID 1's only child):
 *
 *   node agent.mjs                 serve on the virtio-serial port org.forkd.agent, system fix-ups
 *   node agent.mjs --stdio         serve on stdin/stdout (host tests), dry-run fix-ups
 *   node agent.mjs --self-test     check koffi and the libc bindings in this root filesystem, print JSON, exit
 *
 * Options: --template <template.json> --worker <worker.py> --python <python3> --fixups system|dry-run
 *          --port-name <virtio port name> --no-prime (skip priming, to measure what it saves)
 */
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { errorMessage } from "../../common/errors.js";
import { markInheritedCloseOnExec } from "./fds.js";
import { DryRunFixups, type Fixups, SystemFixups, selfTest } from "./fixups.js";
import { type AgentState, createHandlers, helloFor, unavailableFixups } from "./handlers.js";
import { loadLibc } from "./libc.js";
import { createLog } from "./log.js";
import { AGENT_PORT_NAME, findPortDevice, PortTransport } from "./port-transport.js";
import { primeHotPaths } from "./prime.js";
import { PythonWorker } from "./python.js";
import { AgentServer } from "./server.js";
import { DEFAULT_TEMPLATE_PATH, readTemplate } from "./template.js";
import { StdioTransport, type Transport } from "./transport.js";
import { AGENT_VERSION } from "./version.js";

const PORT_SEARCH_INTERVAL_MS = 500;
const PORT_SEARCH_LOG_EVERY = 20;

const BASE_ENV: NodeJS.ProcessEnv = {
  PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  HOME: "/root",
  LANG: "C.UTF-8",
};

const log = createLog();

async function openPort(name: string): Promise<Transport> {
  for (let attempt = 0; ; attempt++) {
    const device = findPortDevice(name);
    if (device !== null) {
      log.info("serving on virtio-serial port", { device, name });
      return new PortTransport(device, log);
    }
    if (attempt % PORT_SEARCH_LOG_EVERY === 0) log.warn("virtio-serial port not found yet", { name });
    await new Promise((resolve) => setTimeout(resolve, PORT_SEARCH_INTERVAL_MS));
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      stdio: { type: "boolean", default: false },
      "self-test": { type: "boolean", default: false },
      template: { type: "string", default: DEFAULT_TEMPLATE_PATH },
      worker: { type: "string", default: fileURLToPath(new URL("./worker.py", import.meta.url)) },
      python: { type: "string", default: "python3" },
      fixups: { type: "string" },
      "port-name": { type: "string", default: AGENT_PORT_NAME },
      /** Skips priming, to measure what it saves. */
      "no-prime": { type: "boolean", default: false },
    },
    strict: true,
  });

  if (values["self-test"]) {
    const report = await selfTest();
    const closeOnExec = markInheritedCloseOnExec(await loadLibc());
    process.stdout.write(`${JSON.stringify({ agent: AGENT_VERSION, ...report, closeOnExec })}\n`);
    return;
  }
  if (values.stdio) {
    // stdout carries the protocol: a stray console.log must not corrupt it.
    console.log = console.error;
    console.info = console.error;
  }

  try {
    const marked = markInheritedCloseOnExec(await loadLibc());
    if (marked.length > 0) log.info("marked inherited descriptors close-on-exec", { fds: marked });
  } catch (err) {
    log.warn("cannot mark inherited descriptors close-on-exec", { error: errorMessage(err) });
  }

  const template = await readTemplate(values.template);
  if (template.problem !== null) log.error("template description unusable", { problem: template.problem });

  // The interpreter starts first: it is the slow part of a cold boot and must be warm by the snapshot.
  const python =
    template.interpreter === "python"
      ? new PythonWorker({ workerPath: values.worker, python: values.python, env: BASE_ENV, cwd: "/", log })
      : null;
  python?.start();

  const fixupsKind = values.fixups ?? (values.stdio ? "dry-run" : "system");
  let fixups: Fixups;
  if (fixupsKind === "dry-run") fixups = new DryRunFixups();
  else if (fixupsKind === "system") {
    fixups = await SystemFixups.create().catch((err: unknown) => {
      log.error("cannot load the system fix-ups (koffi)", { error: errorMessage(err) });
      return unavailableFixups(errorMessage(err));
    });
  } else throw new Error(`--fixups must be "system" or "dry-run", not ${JSON.stringify(fixupsKind)}`);

  const state: AgentState = { template, python, fixups, baseEnv: BASE_ENV, sandboxId: null, hostname: null };
  const transport = values.stdio ? new StdioTransport() : await openPort(values["port-name"]);

  let server: AgentServer | undefined;
  const shutdown = (why: string) => {
    log.info("shutting down", { why });
    server?.abortAll(`the agent is shutting down (${why})`);
    python?.stop();
    // Let the kills reach their process groups before this process goes away.
    setTimeout(() => process.exit(0), 50);
  };
  server = new AgentServer({
    transport,
    handlers: createHandlers(state),
    hello: () => helloFor(state),
    log,
    onEnd: () => shutdown("input closed"),
  });
  process.on("SIGTERM", () => shutdown("SIGTERM"));
  process.on("SIGINT", () => shutdown("SIGINT"));
  // Before the hello: the host snapshots a parent only after it, so the primed state is in every child.
  if (!values["no-prime"]) await primeHotPaths(server, state, log);
  server.start();
  log.info("agent started", {
    version: AGENT_VERSION,
    template: template.name,
    interpreter: template.interpreter,
    fixups: fixups.kind,
    transport: values.stdio ? "stdio" : "virtio-serial",
  });
}

// The agent is the guest's only way to the host: it logs and keeps serving rather than dying.
process.on("uncaughtException", (err) =>
  log.error("uncaught exception", { error: errorMessage(err), stack: err.stack }),
);
process.on("unhandledRejection", (err) => log.error("unhandled rejection", { error: errorMessage(err) }));

main().catch((err: unknown) => {
  log.error("agent failed to start", { error: errorMessage(err) });
  process.exitCode = 1;
});
