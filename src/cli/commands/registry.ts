/**
 * `forkd push TAG REF` and `forkd pull REF [--tag NEW]`: snapshot chains through an OCI registry (see
 * controller/snapshots/registry.ts). Like pack and unpack they work on this host's files directly.
 */
import type { Command } from "commander";
import { resolvePaths } from "../../common/paths.js";
import { pullSnapshot, pushSnapshot } from "../../controller/snapshots/registry.js";
import { oneLine, printJson, startProgress } from "../output.js";
import { runCommand } from "../run-command.js";

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;

export function registerRegistry(program: Command): void {
  program
    .command("push")
    .description(
      "push a snapshot and its ancestors (and their guest image) to an OCI registry; blobs the registry already has are not sent",
    )
    .argument("<tag>", "the snapshot (head of the chain)")
    .argument("<ref>", "registry reference, e.g. registry.example:5000/team/snapshots:v1")
    .option(
      "--insecure",
      "allow plain HTTP or unverified TLS to a registry that is not on a loopback address",
    )
    .option("--without-image", "leave the guest image out (pull then needs that exact image build cached)")
    .option("--json", "print the result as JSON")
    .action(
      (tag: string, ref: string, opts: { insecure?: boolean; withoutImage?: boolean; json?: boolean }) =>
        runCommand(async (signal) => {
          const progress = startProgress(`pushing ${tag} to ${ref}`);
          try {
            const result = await pushSnapshot(resolvePaths(), {
              tag,
              reference: ref,
              insecure: opts.insecure,
              withoutImage: opts.withoutImage,
              signal,
              onProgress: (m) => progress.update(oneLine(m, 120)),
            });
            const sent = result.parts.filter((p) => p.uploaded).length;
            progress.succeed(
              `pushed ${result.chain.join(" -> ")} to ${result.reference} (${result.digest.slice(0, 19)}): ` +
                `${sent} of ${result.parts.length} blobs sent (${mib(result.uploaded_bytes)}), the rest already there ` +
                `(${(result.ms / 1000).toFixed(1)} s)`,
            );
            if (opts.json) printJson(result);
          } catch (err) {
            progress.fail(`pushing ${tag} failed`);
            throw err;
          }
          return undefined;
        }),
    );
  program
    .command("pull")
    .description("pull a snapshot chain from an OCI registry and install it, with every check unpack makes")
    .argument("<ref>", "registry reference, e.g. registry.example:5000/team/snapshots:v1")
    .option("-t, --tag <tag>", "install the head under this tag (its ancestors keep theirs)")
    .option("--force", "replace existing snapshots of the same tags that differ from the pulled ones")
    .option(
      "--insecure",
      "allow plain HTTP or unverified TLS to a registry that is not on a loopback address",
    )
    .option("--json", "print the result as JSON")
    .action((ref: string, opts: { tag?: string; force?: boolean; insecure?: boolean; json?: boolean }) =>
      runCommand(async (signal) => {
        const progress = startProgress(`pulling ${ref}`);
        try {
          const result = await pullSnapshot(resolvePaths(), {
            reference: ref,
            tag: opts.tag,
            force: opts.force,
            insecure: opts.insecure,
            signal,
            onProgress: (m) => progress.update(oneLine(m, 120)),
          });
          progress.succeed(
            `${result.head} ready from ${result.reference}: installed ${result.installed.join(", ") || "nothing new"}` +
              `${result.reused.length > 0 ? `; kept identical ${result.reused.join(", ")}` : ""}; image ${result.image} ` +
              `(${(result.ms / 1000).toFixed(1)} s)`,
          );
          if (opts.json) printJson(result);
        } catch (err) {
          progress.fail(`pulling ${ref} failed`);
          throw err;
        }
        return undefined;
      }),
    );
}
