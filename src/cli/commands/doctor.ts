import type { Command } from "commander";
import { resolvePaths } from "../../common/paths.js";
import { runDoctor } from "../../controller/host/doctor.js";
import { EXIT } from "../exit-codes.js";
import { printJson } from "../output.js";
import { runCommand } from "../run-command.js";

const MARK = { ok: "ok  ", warn: "WARN", fail: "FAIL" } as const;

export function registerDoctor(program: Command): void {
  program
    .command("doctor")
    .description(
      "check what works on this host (QEMU, accelerator by a real probe boot, namespaces, cgroups, space)",
    )
    .option("--json", "print the checks as JSON")
    .action((opts) =>
      runCommand(async (signal) => {
        const checks = await runDoctor(resolvePaths(), { signal });
        if (opts.json) printJson({ checks });
        else {
          for (const c of checks) {
            process.stdout.write(`${MARK[c.status]}  ${c.name.padEnd(12)} ${c.detail}\n`);
            if (c.fix) process.stdout.write(`      ${"".padEnd(12)} -> ${c.fix}\n`);
          }
        }
        return checks.some((c) => c.status === "fail") ? EXIT.failure : EXIT.ok;
      }),
    );
}
