/**
 * Service results (camelCase, Buffers) to wire shapes (snake_case JSON, v0.5-compatible where v0.5 had the field).
 * Kept apart from the routes so the streaming and the buffered exec encode output the same way.
 */
import { constants } from "node:os";
import path from "node:path";
import type { EvalOutcome, ExecOutcome, FileInfo, PingInfo } from "../agent/host/types.js";
import type {
  BranchOutcome,
  EgressPolicy,
  EgressPolicyInput,
  NetworkRequest,
  SandboxInfo,
  SnapshotInfo,
} from "../controller/sandbox-service.js";
import type {
  BranchResultWire,
  EgressPolicyWire,
  FileInfoWire,
  SandboxInfoWire,
  SnapshotInfoWire,
} from "./schemas.js";

export type OutputEncoding = "utf8" | "base64";

export function sandboxToWire(info: SandboxInfo): SandboxInfoWire {
  return {
    id: info.id,
    snapshot_tag: info.snapshot_tag,
    created_at_unix: info.created_at_unix,
    pid: info.pid,
    memory_limit_mib: info.memory_limit_mib,
    status: info.status,
    expires_at_unix_ms: info.expires_at_unix_ms,
    timeout_ms: info.timeout_ms,
    on_timeout: info.on_timeout,
    auto_resume: info.auto_resume,
    pause_tag: info.pause_tag,
    paused_at_unix_ms: info.paused_at_unix_ms,
    ready_ms: info.ready_ms,
    accelerator: info.accelerator,
    live_fork: info.live_fork,
    has_branched: info.branch_count > 0,
    branch_count: info.branch_count,
    last_branch_tag: info.last_branch_tag,
    last_branch_memory_path: info.last_branch_memory_path,
    metadata: info.metadata,
    template_alias: info.template_alias,
    owner: info.owner,
    netns: info.network.netns,
    // v0.5 clients split this at ":" and use the address; there is no agent port on TCP.
    guest_addr: info.network.guestAddress === null ? null : `${info.network.guestAddress}:0`,
    network: {
      kind: info.network.kind,
      address: info.network.address,
      egress: info.network.policy === null ? null : policyToWire(info.network.policy),
    },
    public_ports: !info.inbound.requireTrafficToken,
    limits: info.limits,
  };
}

export function policyToWire(policy: EgressPolicy) {
  return { egress: policy.default, allow_out: policy.allowOut, deny_out: policy.denyOut };
}

/**
 * The wire's egress policy as the controller takes it: a field left out comes from the snapshot's template
 * default, else the daemon's (`--egress`, empty lists).
 */
export function policyFromWire(wire: EgressPolicyWire): EgressPolicyInput {
  return {
    ...(wire.egress === undefined ? {} : { default: wire.egress }),
    ...(wire.allow_out === undefined ? {} : { allowOut: wire.allow_out }),
    ...(wire.deny_out === undefined ? {} : { denyOut: wire.deny_out }),
  };
}

export function networkRequestFromWire(wire: EgressPolicyWire | "none" | undefined): NetworkRequest {
  return wire === undefined || wire === "none" ? wire : policyFromWire(wire);
}

export function snapshotToWire(info: SnapshotInfo, snapshotsDir: string): SnapshotInfoWire {
  return {
    ...info,
    dir: path.join(snapshotsDir, info.tag),
    egress_default: info.egress_default && policyToWire(info.egress_default),
  };
}

/**
 * `measure` adds forkd v0.5's diff measurements (it reported them for `measure_diff` and diff branches):
 * diff_ms = time spent capturing the changed pages, diff_physical_bytes = those pages' bytes, diff_logical_bytes
 * = the guest's RAM size (what a flat image holds).
 */
export function branchToWire(
  outcome: BranchOutcome,
  sourceId: string,
  snapshotsDir: string,
  options: { measure: boolean },
): BranchResultWire {
  return {
    ...snapshotToWire(outcome.snapshot, snapshotsDir),
    status: outcome.status,
    branched_from: sourceId,
    mode: outcome.mode,
    // v0.5 sent whole milliseconds (its CLI parses an integer).
    pause_ms: Math.round(outcome.pause_ms),
    bytes_captured: outcome.bytes_captured,
    bytes_written: outcome.bytes_written,
    ...(options.measure
      ? {
          diff_ms: Math.round(outcome.capture_ms),
          diff_physical_bytes: outcome.bytes_captured,
          diff_logical_bytes: outcome.ram_bytes,
        }
      : {}),
  };
}

/** A process killed by signal N reports 128+N, as shells do: v0.5 clients expect an integer exit code. */
export function exitCodeOf(outcome: Pick<ExecOutcome, "exitCode" | "signal">): number {
  if (outcome.exitCode !== null) return outcome.exitCode;
  const number = outcome.signal ? constants.signals[outcome.signal as NodeJS.Signals] : undefined;
  return number === undefined ? 255 : 128 + number;
}

export function encodeOutput(bytes: Buffer, encoding: OutputEncoding): string {
  return encoding === "base64" ? bytes.toString("base64") : bytes.toString("utf8");
}

export function execToWire(outcome: ExecOutcome, encoding: OutputEncoding) {
  return {
    stdout: encodeOutput(outcome.stdout, encoding),
    stderr: encodeOutput(outcome.stderr, encoding),
    exit_code: exitCodeOf(outcome),
    signal: outcome.signal,
    timed_out: outcome.timedOut,
    stdout_truncated: outcome.stdoutTruncated,
    stderr_truncated: outcome.stderrTruncated,
    duration_ms: outcome.durationMs,
    encoding,
  };
}

export function evalToWire(outcome: EvalOutcome) {
  const error = outcome.error;
  return {
    result: outcome.result,
    error: error
      ? `${error.type}: ${error.message}`
      : outcome.timedOut
        ? "TimeoutError: eval timed out"
        : null,
    exit_code: error || outcome.timedOut ? 1 : 0,
    error_type: error?.type ?? (outcome.timedOut ? "TimeoutError" : null),
    traceback: error?.traceback ?? null,
    stdout: outcome.stdout,
    stderr: outcome.stderr,
    timed_out: outcome.timedOut,
    result_truncated: outcome.resultTruncated,
    stdout_truncated: outcome.stdoutTruncated,
    stderr_truncated: outcome.stderrTruncated,
    duration_ms: outcome.durationMs,
  };
}

export function pingToWire(info: PingInfo) {
  return {
    pong: true as const,
    protocol: info.protocol,
    agent_version: info.agentVersion,
    template: info.template,
    interpreter: info.interpreter,
    warm: info.warm,
    sandbox_id: info.sandboxId,
    hostname: info.hostname,
    uptime_ms: info.uptimeMs,
  };
}

export function fileInfoToWire(info: FileInfo): FileInfoWire {
  return {
    name: info.name,
    type: info.type,
    size: info.size,
    mode: info.mode,
    mtime_ms: info.mtimeMs,
    link_target: info.linkTarget ?? null,
  };
}
