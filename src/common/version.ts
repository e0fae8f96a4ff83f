import { readFileSync } from "node:fs";

/** The package version, read once from package.json (two levels above this file in src/ and in dist/src/). */
function readVersion(): string {
  for (const rel of ["../../package.json", "../../../package.json"]) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(rel, import.meta.url), "utf8")) as {
        name?: string;
        version?: string;
      };
      if (pkg.name === "forkd" && pkg.version) return pkg.version;
    } catch {
      // try the next candidate
    }
  }
  return "0.0.0-unknown";
}

export const FORKD_VERSION = readVersion();
