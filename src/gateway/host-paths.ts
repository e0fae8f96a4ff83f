/**
 * What a node says of its snapshots names where they live on its host (`dir`, a field forkd v0.5's clients
 * read from a single daemon). Through the gateway that path says nothing a caller can use (the caller has no
 * shell on any node) and tells it each node's layout: every snapshot record the gateway answers with goes
 * through here and leaves without it. The gateway adds `node` instead.
 */

/** The fields of a node's snapshot record that are paths on its host. */
export const HOST_PATH_FIELDS = ["dir"] as const;

export function withoutHostPaths<T extends object>(record: T): Omit<T, (typeof HOST_PATH_FIELDS)[number]> {
  const copy = { ...record } as Record<string, unknown>;
  for (const field of HOST_PATH_FIELDS) delete copy[field];
  return copy as Omit<T, (typeof HOST_PATH_FIELDS)[number]>;
}
