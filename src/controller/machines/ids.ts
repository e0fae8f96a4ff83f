import { randomBytes } from "node:crypto";

/** Sandbox ids are also the child's hostname and the name of its run directory: keep them short and safe. */
export function newSandboxId(): string {
  return `sb-${randomBytes(6).toString("hex")}`;
}
