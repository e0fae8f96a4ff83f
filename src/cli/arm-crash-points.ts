/**
 * `forkd pack` and `forkd unpack` work on this host's files without the daemon, so they honour the same crash
 * points (FORKD_CRASH_AT, src/common/crash-points.ts) for the fault-injection suite; a misspelt point is a usage
 * error before anything is touched.
 */
import { armCrashPoints } from "../common/crash-points.js";
import { errorMessage, invalidArgument } from "../common/errors.js";

export function armCliCrashPoints(): void {
  try {
    armCrashPoints();
  } catch (err) {
    throw invalidArgument(errorMessage(err));
  }
}
