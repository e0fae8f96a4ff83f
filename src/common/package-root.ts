/**
 * The forkd package's own directory, resolved from this module's location (never from the working directory),
 * so `forkd` works from anywhere and from both `src/` (tsx) and `dist/src/` (compiled).
 */
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { ForkdError } from "./errors.js";

let cachedRoot: string | undefined;

export function packageRoot(): string {
  if (cachedRoot) return cachedRoot;
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const manifest = path.join(dir, "package.json");
    if (fs.existsSync(manifest)) {
      const pkg = JSON.parse(fs.readFileSync(manifest, "utf8")) as { name?: unknown };
      if (pkg.name === "forkd") {
        cachedRoot = dir;
        return dir;
      }
    }
    const parent = path.dirname(dir);
    if (parent === dir) throw new ForkdError("internal", "cannot find the forkd package root (package.json)");
    dir = parent;
  }
}
