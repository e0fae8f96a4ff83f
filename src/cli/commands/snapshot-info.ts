/** `forkd snapshot-info TAG`: a snapshot's chain (ancestors, dependents) and what each layer takes on disk. */

import type { Command } from "commander";
import { policyToWire } from "../../api/wire.js";
import { resolvePaths } from "../../common/paths.js";
import { localSnapshotDetail } from "../../controller/snapshots/chains.js";
import type { SnapshotDetail } from "../../sdk/index.js";
import { printJson, printTable } from "../output.js";
import { addSnapshotDaemonOptions, runSnapshotCommand } from "./snapshots-remote.js";

/** GET /v1/snapshots/:tag/info, from the daemon (through the SDK) or made here by the local engine. */
type Detail = SnapshotDetail;

export function registerSnapshotInfo(program: Command): void {
  addSnapshotDaemonOptions(
    program
      .command("snapshot-info")
      .description("show a snapshot's chain (ancestors, dependents) and the bytes each layer takes")
      .argument("<tag>", "snapshot tag"),
  )
    .option("--json", "print JSON (the shape of GET /v1/snapshots/:tag/info)")
    .action((tag: string, opts: { json?: boolean }, command: Command) =>
      runSnapshotCommand(command, async (daemon, signal) => {
        const detail: Detail = daemon
          ? await daemon.controller.getSnapshot(tag, { signal })
          : localDetailToWire(await localSnapshotDetail(resolvePaths(), tag));
        if (opts.json) printJson(detail);
        else printDetail(detail);
        return undefined;
      }),
    );
}

function localDetailToWire(d: Awaited<ReturnType<typeof localSnapshotDetail>>): Detail {
  return { ...d, egress_default: d.egress_default && policyToWire(d.egress_default) };
}

function printDetail(d: Detail): void {
  const out = (label: string, value: string) => process.stdout.write(`${label.padEnd(11)}${value}\n`);
  out("snapshot", `${d.tag} (${d.status}${d.bootable ? ", bootable" : ", NOT bootable"})`);
  out("template", `${d.template ?? "-"}, ${d.accelerator ?? "-"}, ${d.memory_mib ?? "-"} MiB`);
  out(
    "parent",
    d.parent_tag === null
      ? "none"
      : `${d.parent_tag} (manifest sha256 ${d.parent_content_hash?.slice(0, 16) ?? "?"}…)`,
  );
  if (d.egress_default) {
    const { egress, allow_out: allow, deny_out: deny } = d.egress_default;
    const lists = [
      allow.length ? `allow ${allow.join(", ")}` : "",
      deny.length ? `deny ${deny.join(", ")}` : "",
    ];
    out("egress", [`${egress} by default (the template's)`, ...lists.filter(Boolean)].join("; "));
  }
  out("chain", `depth ${d.chain_depth}: ${[...d.ancestors, d.tag].join(" -> ")}`);
  out(
    "dependents",
    d.dependents.length === 0
      ? "none"
      : d.all_dependents.length > d.dependents.length
        ? `${d.dependents.join(", ")} (all: ${d.all_dependents.join(", ")})`
        : d.dependents.join(", "),
  );
  if (d.chain_error) out("problem", d.chain_error);
  else if (d.error) out("problem", d.error);
  if (d.layers.length === 0) return;
  process.stdout.write("\n");
  printTable(
    ["LAYER", "ORIGIN", "MEMORY", "RAM", "MEM ON DISK", "DISK SIZE", "DISK ON DISK", "VMSTATE"],
    [
      ...d.layers.map((l) => [
        l.tag,
        l.origin,
        l.memory.format === "flat" ? "flat" : `layer, ${l.memory.pages} pages`,
        bytes(l.memory.logical_bytes),
        bytes(l.memory.physical_bytes),
        bytes(l.disk.logical_bytes),
        bytes(l.disk.physical_bytes),
        bytes(l.vmstate_bytes),
      ]),
      [
        "chain",
        "",
        "",
        "",
        bytes(d.chain_bytes.memory_physical),
        "",
        bytes(d.chain_bytes.disk_physical),
        bytes(d.chain_bytes.vmstate),
      ],
    ],
  );
}

/** 1536 -> "1.5 KiB". */
export function bytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(1)} ${units[unit]}`;
}
