/**
 * Whom build steps run as on the host. A step is root in a user namespace of its own whose ids 0..65535 are the
 * host's [base, base + 65536): unprivileged ids no account has, reserved for the system user `forkd-build` in
 * /etc/subuid and /etc/subgid (as src/isolation/identity.ts reserves the QEMUs' range for `forkd-vm`), so no
 * other user's namespaces can ever own them. An image tree a step works on is owned by the shifted ids on disk
 * (umoci unpacks it with the mapping and repacks it back), so a setuid-root file a step leaves is setuid to
 * `base`, an unprivileged id, never to the host's root.
 *
 * Every build uses the same range; builds are kept apart by their namespaces (mount, PID, IPC, network), not
 * by their ids.
 */
import { invalidArgument } from "../../common/errors.js";
import {
  ensureReservation,
  type IdentityStatus,
  reservationStatus,
  type VmUidRange,
} from "../../isolation/identity.js";

export const BUILD_USER = "forkd-build";
/** Below forkd-vm's range (2000000000 up), above systemd's container ranges (which end at 1879048191). */
export const DEFAULT_BUILD_UID_BASE = 1_900_000_000;
/** The ids an image may use: 0..65535, as container runtimes map them. */
export const BUILD_ID_COUNT = 65_536;

export type BuildIdRange = VmUidRange;

/** `FORKD_BUILD_UID_BASE`, or the default. */
export function buildIdRange(env: NodeJS.ProcessEnv = process.env): BuildIdRange {
  const raw = env.FORKD_BUILD_UID_BASE;
  const base = raw === undefined || raw === "" ? DEFAULT_BUILD_UID_BASE : Number(raw);
  if (!Number.isInteger(base) || base < BUILD_ID_COUNT || base + BUILD_ID_COUNT - 1 > 2 ** 31 - 2) {
    throw invalidArgument(
      `FORKD_BUILD_UID_BASE must be an integer in ${BUILD_ID_COUNT}..${2 ** 31 - 1 - BUILD_ID_COUNT}, got ${JSON.stringify(raw)}`,
    );
  }
  return { base, count: BUILD_ID_COUNT };
}

/** The reservation, made if missing (once per process); refused when another account uses those ids. */
export function ensureBuildIdentity(range = buildIdRange()): Promise<IdentityStatus> {
  return ensureReservation(
    BUILD_USER,
    range,
    "forkd reserves the uid range build steps run as",
    "FORKD_BUILD_UID_BASE",
  );
}

/** What /etc says about the reservation (for `forkd doctor`). */
export function buildIdentityStatus(range = buildIdRange()): Promise<IdentityStatus> {
  return reservationStatus(BUILD_USER, range);
}

/** The host id an image's id `id` is on disk while steps work on the tree. */
export function hostId(range: BuildIdRange, id: number): number {
  if (!Number.isInteger(id) || id < 0 || id >= range.count) {
    throw invalidArgument(`id ${id} is outside the ids an image may use (0..${range.count - 1})`);
  }
  return range.base + id;
}

/** umoci's --uid-map / --gid-map value for the range (container:host:size). */
export function umociIdMap(range: BuildIdRange): string {
  return `0:${range.base}:${range.count}`;
}
