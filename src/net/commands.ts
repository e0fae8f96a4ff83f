/**
 * Running the network tools (ip, nft, the launcher): argv arrays, never a shell; bounded output; a deadline; and
 * errors that say which command failed and what it printed.
 */
import { execFile } from "node:child_process";
import { ForkdError } from "../common/errors.js";
import { launcherPrefix } from "../isolation/launcher.js";
import { netnsPath } from "./names.js";

/** ip and nft finish in milliseconds; this only catches a wedged one (a host under heavy load is slow). */
export const TOOL_TIMEOUT_MS = 30_000;
const MAX_OUTPUT_BYTES = 4 * 1024 * 1024;

export async function runTool(
  command: string,
  args: readonly string[],
  options: { input?: string } = {},
): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile(
      command,
      [...args],
      { timeout: TOOL_TIMEOUT_MS, maxBuffer: MAX_OUTPUT_BYTES, killSignal: "SIGKILL" },
      (err, stdout, stderr) => {
        if (!err) {
          resolve(stdout);
          return;
        }
        const code = (err as NodeJS.ErrnoException).code;
        const why =
          code === "ENOENT"
            ? "not found (apt-get install iproute2 nftables; npm run build for the launcher)"
            : String(stderr).trim() || err.message;
        reject(new ForkdError("unavailable", `${[command, ...args].join(" ")}: ${why}`, { cause: err }));
      },
    );
    if (options.input !== undefined) child.stdin?.end(options.input);
  });
}

/** `ip -batch -`: many ip commands in one process; in namespace `netns` when given. Stops at the first error. */
export function ipBatch(lines: readonly string[], netns?: string): Promise<string> {
  const args = netns === undefined ? ["-batch", "-"] : ["-n", netns, "-batch", "-"];
  return runTool("ip", args, { input: `${lines.join("\n")}\n` });
}

/** Applies an nft script (one transaction) in the host namespace. */
export function nftHost(script: string): Promise<string> {
  return runTool("nft", ["-f", "-"], { input: script });
}

/**
 * Applies an nft script (one transaction) inside namespace `netns`, after writing `sysctls` there: the
 * launcher joins the namespace and execs nft, so this costs one process.
 */
export function nftInNamespace(
  netns: string,
  script: string,
  sysctls: Record<string, string | number> = {},
): Promise<string> {
  const [binary, ...prefix] = launcherPrefix({ netns: { join: netnsPath(netns) }, sysctls });
  return runTool(binary as string, [...prefix, "nft", "-f", "-"], { input: script });
}
