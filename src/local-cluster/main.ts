/**
 * The local cluster's command line (scripts/local-cluster.sh runs it from dist):
 *   up [--nodes N] [--gateways G] [--dir D] [--seed-home H] [--node-max-sandboxes M] [--durable-pause]
 *                                                              start it; print shell assignments on stdout
 *   status [--dir D]                                           JSON: nodes, gateway, processes
 *   down [--dir D]                                             stop and remove all of it
 *   balance LISTEN BACKEND...                                  (internal) the gateway Service's stand-in
 */
import { parseArgs } from "node:util";
import { down, shellAssignments, status, up } from "./cluster.js";
import { DEFAULT_NODES, defaultDir } from "./defaults.js";
import { serveBalancer } from "./service-proxy.js";

const USAGE =
  "usage: local-cluster.sh up [--nodes N] [--gateways G] [--dir D] [--seed-home H] [--node-max-sandboxes M] [--durable-pause] | status | down";

function hostPort(text: string): { host: string; port: number } {
  const at = text.lastIndexOf(":");
  const port = Number(text.slice(at + 1));
  if (at <= 0 || !Number.isInteger(port) || port < 1 || port > 65535)
    throw new Error(`not host:port: ${text}`);
  return { host: text.slice(0, at), port };
}

function count(text: string | undefined, fallback: number, what: string, max: number): number {
  if (text === undefined) return fallback;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1 || n > max)
    throw new Error(`--${what} must be an integer from 1 to ${max}`);
  return n;
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === "balance") {
    const [listen, ...backends] = rest;
    if (!listen || backends.length === 0) throw new Error("balance LISTEN BACKEND...");
    const at = hostPort(listen);
    const server = serveBalancer(backends.map(hostPort));
    server.listen(at.port, at.host);
    await new Promise<void>((resolve) => {
      process.once("SIGTERM", () => server.close(() => resolve()));
      process.once("SIGINT", () => server.close(() => resolve()));
    });
    return 0;
  }
  const { values } = parseArgs({
    args: rest,
    options: {
      nodes: { type: "string" },
      gateways: { type: "string" },
      dir: { type: "string" },
      "seed-home": { type: "string" },
      "node-max-sandboxes": { type: "string" },
      "durable-pause": { type: "boolean" },
    },
    strict: true,
  });
  const dir = values.dir ?? defaultDir();
  switch (command) {
    case "up": {
      const state = await up({
        dir,
        nodes: count(values.nodes, DEFAULT_NODES, "nodes", 16),
        gateways: count(values.gateways, 2, "gateways", 8),
        seedHome: values["seed-home"],
        nodeMaxSandboxes:
          values["node-max-sandboxes"] === undefined
            ? undefined
            : count(values["node-max-sandboxes"], 0, "node-max-sandboxes", 100_000),
        durablePause: values["durable-pause"] === true,
        log: (line) => process.stderr.write(`local-cluster: ${line}\n`),
      });
      for (const [name, value] of Object.entries(shellAssignments(state))) {
        process.stdout.write(`export ${name}=${value}\n`);
      }
      return 0;
    }
    case "status":
      process.stdout.write(`${JSON.stringify(await status(dir), null, 2)}\n`);
      return 0;
    case "down": {
      const left = await down(dir);
      if (left.length > 0) {
        process.stderr.write(`local-cluster: left behind: ${left.join(", ")}\n`);
        return 1;
      }
      return 0;
    }
    default:
      process.stderr.write(`${USAGE}\n`);
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: Error) => {
    process.stderr.write(`local-cluster: ${err.message}\n`);
    process.exit(1);
  },
);
