/** What a spawn costs the host: its wall clock and host CPU per child, QEMUs and this process's tools included. */
import { execFileSync } from "node:child_process";
import { procStatFields } from "../../src/controller/host/processes.js";
import type { openServices } from "../../src/controller/sandboxes/manager.js";
import { netd } from "../../src/net/netd-client.js";
import { cpuMs } from "./report.js";

let clockTicks: number | undefined;

/** Spawns `n` from `tag`; wall clock of the spawn and host CPU per child (QEMUs + this process + its tools). */
export async function measureSpawn(
  services: Awaited<ReturnType<typeof openServices>>,
  tag: string,
  n: number,
): Promise<{ wallMs: number; cpuPerChildMs: number }> {
  const selfBefore = await ownCpuMs();
  const started = performance.now();
  const children = await services.sandboxes.spawn({ snapshotTag: tag, n, timeoutMs: 0 });
  const wallMs = performance.now() - started;
  const selfAfter = await ownCpuMs();
  const qemuMs = (await Promise.all(children.map((c) => cpuMs(c.pid as number)))).reduce((a, b) => a + b, 0);
  return { wallMs, cpuPerChildMs: (qemuMs + selfAfter - selfBefore) / n };
}

/**
 * This process's CPU plus that of its children it has waited for (ip, nft, the launcher running nft), plus the
 * running network helper's (forkd-netd, a child that is only waited for when it ends) and its waited-for nft's.
 */
export async function ownCpuMs(): Promise<number> {
  const helper = netd().pid;
  return (await processTreeCpuMs(process.pid)) + (helper === undefined ? 0 : await processTreeCpuMs(helper));
}

async function processTreeCpuMs(pid: number): Promise<number> {
  const fields = (await procStatFields(pid).catch(() => undefined)) as string[] | undefined;
  if (!fields) return 0;
  const ticks = Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14]);
  clockTicks ??= Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim());
  return (ticks * 1000) / clockTicks;
}
