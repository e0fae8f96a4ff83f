/**
 * The options of the Controller's methods (camelCase, as callers write them), the translation of an egress policy
 * to the wire, and the check every string argument gets before anything is sent.
 */
import { InvalidArgumentError } from "./errors.js";
import type { RequestOptions } from "./settings.js";
import type { EgressPolicyWire } from "./wire.js";

/** An egress policy (camelCase, as in E2B's `network` option; see docs/network.md). */
export interface NetworkPolicy {
  /**
   * Destinations no entry names: "allow" or "deny". A field left out comes from the snapshot's template default
   * (`[egress]`, docs/templates.md). @default the template's, else the daemon's --egress
   */
  egress?: "allow" | "deny";
  /** IPv4 addresses, CIDRs, domain names, *.domain wildcards; an allow entry wins over a deny entry. */
  allowOut?: string[];
  /** Same forms; "0.0.0.0/0" means egress "deny". */
  denyOut?: string[];
}

export function policyToWire(policy: NetworkPolicy | "none"): EgressPolicyWire | "none" {
  if (policy === "none") return "none";
  const wire: EgressPolicyWire = {};
  if (policy.egress !== undefined) wire.egress = policy.egress;
  if (policy.allowOut !== undefined) wire.allow_out = policy.allowOut;
  if (policy.denyOut !== undefined) wire.deny_out = policy.denyOut;
  return wire;
}

export interface SpawnOptions extends RequestOptions {
  snapshotTag: string;
  /** How many children (1..1000), all or none. The call waits `requestTimeoutMs` + 1 s per child. @default 1 */
  n?: number;
  /**
   * Limits per sandbox (docs/security.md, Limits); absent: the daemon's defaults (memory = guest RAM + 256 MiB,
   * one CPU per vCPU, 128 tasks, its --disk-limit-mib). One the daemon's host cannot enforce is a 501.
   */
  memoryLimitMib?: number;
  /** CPU bandwidth in thousandths of a CPU (500 = half a CPU). */
  cpuLimitMillicores?: number;
  /** Processes and threads of the sandbox's QEMU. */
  pidsLimit?: number;
  /** Largest size of the sandbox's writable disk layer. */
  diskLimitMib?: number;
  /**
   * Each sandbox's lifetime in ms, counted from spawn; 0 = no limit. @default the daemon's: none (it lives
   * until killed) unless the daemon runs with `--default-timeout-ms`. `Sandbox.create` sends 5 minutes.
   */
  timeoutMs?: number;
  /**
   * Egress policy, or "none" (the sandbox's NIC leads nowhere). @default the snapshot's template default
   * (`[egress]`), else the daemon's --egress. Domain entries
   * work through the sandbox's DNS; other sandboxes, the host and the daemon are never reachable.
   */
  network?: NetworkPolicy | "none";
  /** What the end of the lifetime does: kill the sandbox, or pause it to disk (resume it later). @default "kill" */
  onTimeout?: "kill" | "pause";
  /**
   * Whether its ports are public on the E2B data plane (E2B's allowPublicTraffic). false: requests there need
   * its traffic access token; the forkd port route is unaffected. @default true
   */
  publicPorts?: boolean;
  /** forkd v0.5 flags, sent only when given; the daemon answers 501 for features it has not built. */
  perChildNetns?: boolean;
  prewarm?: boolean;
  liveFork?: boolean;
  hugepages?: boolean;
}

export interface ExecCommandOptions extends RequestOptions {
  /** Kill the command after this many ms; 0 = no limit (the daemon's maximum, 24 h). @default 60_000 */
  timeoutMs?: number;
  /** forkd v0.5 spelling of the command timeout, in seconds; `timeoutMs` wins if both are given. */
  timeoutSecs?: number;
  envs?: Record<string, string>;
  /** Absolute working directory in the guest. @default / */
  cwd?: string;
  /** Written to the command's stdin, which is then closed. */
  stdin?: string | Uint8Array;
  /** How `execCommand` puts output bytes in its JSON strings. @default "utf8" (invalid bytes replaced) */
  encoding?: "utf8" | "base64";
}

export interface ExecStreamOptions extends Omit<ExecCommandOptions, "stdin" | "encoding"> {
  /** Stdin as a whole, or streamed while the command runs (closed when the iterable ends). */
  stdin?: string | Uint8Array | AsyncIterable<string | Uint8Array>;
}

export interface EvalCodeOptions extends RequestOptions {
  /** Kill the evaluation after this many ms; 0 = no limit. @default 60_000 */
  timeoutMs?: number;
}

export interface BranchOptions extends RequestOptions {
  tag?: string;
  /**
   * `full`: a snapshot that stands alone (flat memory, one disk layer, no parent); `diff`: only what the sandbox
   * changed, on top of its base (a chain); `live`: like diff, memory captured while the sandbox runs (needs
   * `liveFork` at spawn). @default the daemon's: "full" (as forkd v0.5)
   */
  mode?: "full" | "diff" | "live";
  /** Wait until the snapshot is ready (live mode may return while it is still `writing`). @default true */
  wait?: boolean;
  /** forkd v0.5 forms of `mode`. */
  diff?: boolean;
  live?: boolean;
  /** Report forkd v0.5's `diff_ms` / `diff_*_bytes` (mode diff always does). */
  measureDiff?: boolean;
  /** forkd v0.5: the parent the caller expects (the sandbox's base); a mismatch is a ConflictError. */
  parentTag?: string;
}

export interface CreateSnapshotOptions extends RequestOptions {
  tag: string;
  /** Template name (templates/<name>.toml on the daemon's host). @default the tag */
  template?: string;
  /**
   * forkd v0.5's form instead of `template`: the kernel and root filesystem of a built forkd image on the
   * daemon's host (its vmlinuz and rootfs.ext4, in an allowed image directory; anything else is refused with
   * InvalidArgumentError naming the directories).
   */
  kernel?: string;
  rootfs?: string;
  /**
   * Longest wait for the build, boot and warm-up in ms; 0 = no limit. Replaces `requestTimeoutMs` for this call.
   * @default 1_800_000 (30 minutes)
   */
  timeoutMs?: number;
}

export interface ReadFileOptions extends RequestOptions {
  /** Refuse files larger than this many bytes. */
  maxBytes?: number;
}

export interface WriteFileOptions extends RequestOptions {
  /** Permission bits of a new file, e.g. 0o755. */
  mode?: number;
}

/** A string argument the call cannot go without (ids, tags, paths). */
export function required(value: string, name: string): string {
  if (typeof value !== "string" || value === "")
    throw new InvalidArgumentError(`${name} must be a non-empty string`);
  return value;
}
