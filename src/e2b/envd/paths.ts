/**
 * Paths as envd takes them: absolute, `~` or `~/...` (the user's home), or relative to the user's home; `..`
 * segments are resolved, as in E2B. Paths only ever name files inside the guest (the agent opens them there),
 * so resolving `..` cannot reach the host.
 */
import path from "node:path";
import { MAX_PATH_CHARS } from "../../agent/protocol/limits.js";
import { invalidArgument } from "../../common/errors.js";
import type { GuestUser } from "./guest-users.js";

/** What can be refused before the user is known: NUL bytes, excessive length. */
export function checkRequestedPath(requested: string | undefined): string {
  const value = requested ?? "";
  if (value.includes("\0")) throw invalidArgument("path contains a NUL byte");
  if (value.length > MAX_PATH_CHARS) {
    throw invalidArgument(`path is longer than ${MAX_PATH_CHARS} characters`);
  }
  return value;
}

export function resolveGuestPath(requested: string | undefined, user: GuestUser): string {
  const value = checkRequestedPath(requested);
  let expanded = value;
  if (value === "~" || value.startsWith("~/")) expanded = path.posix.join(user.home, value.slice(1));
  else if (value.startsWith("~")) {
    throw invalidArgument(
      `cannot expand ${JSON.stringify(value)}: only ~ (the user's own home) is supported`,
    );
  }
  const resolved = path.posix.resolve(user.home, expanded === "" ? "." : expanded);
  if (resolved.length > MAX_PATH_CHARS)
    throw invalidArgument(`path is longer than ${MAX_PATH_CHARS} characters`);
  return resolved;
}
