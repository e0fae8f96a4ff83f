#!/usr/bin/env node
// The Go half of `npm run lint`: fails on any file gofmt would change, then runs go vet.
import { execFileSync } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const unformatted = execFileSync("gofmt", ["-l", "src"], { cwd: root, encoding: "utf8" }).trim();
if (unformatted !== "") {
  console.error(`gofmt would change these files (run gofmt -w):\n${unformatted}`);
  process.exit(1);
}
execFileSync("go", ["vet", "./src/..."], {
  cwd: root,
  stdio: "inherit",
  env: { ...process.env, CGO_ENABLED: "0" },
});
// The network helper is a module of its own (its netlink dependency stays out of the agent's and launcher's).
execFileSync("go", ["vet", "."], {
  cwd: path.join(root, "src", "net", "netd"),
  stdio: "inherit",
  env: { ...process.env, CGO_ENABLED: "0", GOFLAGS: "-mod=readonly" },
});
