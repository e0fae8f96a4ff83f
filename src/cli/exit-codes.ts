/** Process exit codes of the forkd CLI. */
export const EXIT = {
  ok: 0,
  /** The operation ran and failed (or some children failed). */
  failure: 1,
  /** Bad arguments: nothing was attempted. */
  usage: 2,
  /** Interrupted by Ctrl-C (128 + SIGINT). */
  interrupted: 130,
} as const;
