/** `forkd network`: the daemon's network mode, or a sandbox's egress policy (shown, or replaced while it runs). */
import type { Command } from "commander";
import { invalidArgument } from "../../common/errors.js";
import type { NetworkPolicy, SandboxInfo } from "../../sdk/index.js";
import { addDaemonOptions, runDaemonCommand } from "../daemon-connection.js";
import { printJson } from "../output.js";

const collect = (value: string, previous: string[] = []) => [...previous, value];

/** The egress flags shared by `spawn` and `network`. */
export function addEgressOptions(command: Command): Command {
  return command
    .option(
      "--egress <allow|deny>",
      "destinations no rule names: allowed or denied (default: the template's [egress], else the daemon's --egress)",
    )
    .option(
      "--allow-out <dest>",
      "allow an IPv4 address, CIDR, domain or *.domain (repeatable; wins over --deny-out)",
      collect,
    )
    .option("--deny-out <dest>", "deny an IPv4 address, CIDR, domain or *.domain (repeatable)", collect);
}

/** The policy the egress flags describe, or undefined when none was given. */
export function egressFromOptions(opts: {
  egress?: string;
  allowOut?: string[];
  denyOut?: string[];
}): NetworkPolicy | undefined {
  if (opts.egress !== undefined && opts.egress !== "allow" && opts.egress !== "deny") {
    throw invalidArgument(`--egress must be allow or deny, got ${JSON.stringify(opts.egress)}`);
  }
  if (opts.egress === undefined && !opts.allowOut && !opts.denyOut) return undefined;
  return {
    ...(opts.egress === undefined ? {} : { egress: opts.egress as "allow" | "deny" }),
    ...(opts.allowOut ? { allowOut: opts.allowOut } : {}),
    ...(opts.denyOut ? { denyOut: opts.denyOut } : {}),
  };
}

export function registerNetwork(program: Command): void {
  addDaemonOptions(
    addEgressOptions(
      program
        .command("network")
        .description(
          "without an id: how the daemon networks sandboxes; with one: its network, or with egress flags, replace its egress policy while it runs",
        )
        .argument("[id]", "sandbox id"),
    ).option("--json", "print JSON"),
  ).action((id: string | undefined, opts, command: Command) =>
    runDaemonCommand(command, async ({ controller }, signal) => {
      const policy = egressFromOptions(opts);
      if (id === undefined) {
        if (policy) throw invalidArgument("egress flags need a sandbox id");
        const status = await controller.networkStatus({ signal });
        if (opts.json) printJson(status);
        else
          for (const [key, value] of Object.entries(status)) process.stdout.write(`${key}: ${fmt(value)}\n`);
        return undefined;
      }
      const info = policy
        ? await controller.setNetworkPolicy(id, policy, { signal })
        : await controller.getSandbox(id, { signal });
      if (opts.json) printJson(info.network);
      else printSandboxNetwork(info);
      return undefined;
    }),
  );
}

export function printSandboxNetwork(info: SandboxInfo): void {
  const network = info.network ?? { kind: "none", address: null, egress: null };
  const lines = [
    `${info.id}: ${network.kind}${info.netns ? ` (netns ${info.netns}, address ${network.address})` : ""}`,
  ];
  if (network.egress) {
    lines.push(`  egress: ${network.egress.egress}`);
    if (network.egress.allow_out.length > 0) lines.push(`  allow: ${network.egress.allow_out.join(", ")}`);
    if (network.egress.deny_out.length > 0) lines.push(`  deny:  ${network.egress.deny_out.join(", ")}`);
  }
  process.stdout.write(`${lines.join("\n")}\n`);
}

function fmt(value: unknown): string {
  if (value === null) return "-";
  return Array.isArray(value) ? value.join(", ") || "-" : String(value);
}
