/**
 * A durable pause at the gateway (docs/kubernetes.md, "The durable pause"): the pause relayed to the sandbox's
 * node, then the node asked to make it durable (push the pause chain to the cluster registry, list it in its
 * ForkdNode status); answered once both are done. One function for both APIs that pause: forkd's route
 * (`{durable: true}`, or by default under `--durable-pause`) and E2B's (every pause that keeps memory under
 * `--durable-pause`); each API passes its own node call for the pause and answers in its own shape.
 */
import { type DurablePauseAnswer, NODE_ROUTES } from "../cluster/protocol.js";
import { ForkdError } from "../common/errors.js";
import type { GatewayContext } from "./context.js";

/**
 * Whether a pause asked for through the gateway is made durable: `asked` is what the caller said (forkd's
 * `durable`; undefined when it said nothing, as E2B callers never do), `memory` whether the pause keeps memory
 * (undefined: it does). A filesystem-only pause keeps a local disk only: never durable by default, refused when
 * asked for (a durable pause moves memory and disk together).
 */
export function pauseIsDurable(
  context: GatewayContext,
  asked: boolean | undefined,
  memory: boolean | undefined,
): boolean {
  if (asked === true && memory === false) {
    throw new ForkdError(
      "invalid_argument",
      "a durable pause keeps memory: memory false keeps a local disk only",
    );
  }
  if (memory === false) return false;
  return asked ?? context.durablePause;
}

/**
 * Runs `pause` (the node's own pause route, as the caller's API has it) on `node`, then makes sandbox `id`
 * durable there. A refused pause throws as the node refused it (nothing happened). A pause that happened but
 * was not made durable throws 503 `unavailable` (507 `insufficient_storage` when the node lists as many durable
 * pauses as it may), saying the sandbox is paused but not durably, with `detail: {paused: true, durable: false}`:
 * it stays paused on its node, and a lost node loses it as before.
 */
export async function pauseThenMakeDurable<T>(
  context: GatewayContext,
  id: string,
  node: string,
  pause: () => Promise<T>,
): Promise<{ paused: T; durable: DurablePauseAnswer }> {
  const paused = await pause();
  const call = { method: "POST" as const, path: `${NODE_ROUTES.durablePauses}/${id}`, deadlineMs: 0 };
  try {
    // As the cluster (no tenant): the node's durable-pause route takes the node token only.
    const durable = await context.calls.json<DurablePauseAnswer>(node, call, null);
    return { paused, durable };
  } catch (err) {
    const why = err instanceof ForkdError ? err.message : String(err);
    const full = err instanceof ForkdError && err.code === "insufficient_storage";
    throw new ForkdError(
      full ? "insufficient_storage" : "unavailable",
      `sandbox ${id} is paused on node ${node}, but not durably: ${why}`,
      { detail: { paused: true, durable: false } },
    );
  }
}
