/**
 * Names of one sandbox's network objects, all derived from its validated id, so a record in the database is
 * enough to find (and remove) everything it owns, and two sandboxes can never share one.
 */
import { assertSandboxId } from "../common/names.js";

/** Inside every namespace: the tap QEMU's NIC is attached to, and the namespace's end of the veth. */
export const TAP_IFNAME = "tap0";
export const UPLINK_IFNAME = "up0";

export interface SandboxNetNames {
  /** Named network namespace (/run/netns/<netns>); `ip netns exec <netns> ...` works on it. */
  netns: string;
  /** The veth's host end, a port of the bridge (interface names are at most 15 bytes). */
  veth: string;
}

export function sandboxNetNames(sandboxId: string): SandboxNetNames {
  const hex = assertSandboxId(sandboxId).slice(3);
  return { netns: `forkd-${sandboxId}`, veth: `fk${hex}` };
}

export function netnsPath(netns: string): string {
  return `/run/netns/${netns}`;
}
