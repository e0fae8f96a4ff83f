#!/usr/bin/env node
/**
 * `npm pack` / `npm publish` run this first (package.json "prepack"): it makes the release artifact's contents.
 *
 *  1. A clean build: dist/ is removed and rebuilt (`npm run build`), so no file of a source that was moved or
 *     deleted since the last build is packed. FORKD_PACK_PREBUILT=1 packs the dist/ that is there instead (the
 *     install test packs right after the build it runs from); it must still pass the checks below.
 *  2. Checks: everything the package resolves at run time is built (the list below), and every compiled file
 *     under dist/src has its source in src/ (a stale dist/ refuses to pack).
 *  3. npm-shrinkwrap.json, a copy of package-lock.json: npm installs a package's shrinkwrap as it is, so
 *     `npm install -g ./forkd-<v>.tgz` gets the dependency versions the tests ran with (dev ones left out).
 *     scripts/postpack.mjs removes it again; the checkout's own installs keep using package-lock.json.
 */
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, readdirSync, rmSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const at = (rel) => path.join(root, rel);

/** What the installed package opens relative to its root (src/common/package-root.ts and its users). */
const RUNTIME_FILES = [
  "dist/src/cli/main.js", // bin/forkd.js, bin/forkd-controller.js, bin/forkd-mcp.js
  "dist/src/sdk/index.js", // the "./sdk" export
  "dist/guest/forkd-agent", // src/image/package-root.ts: defaultGuestPayloadDir, copied into every image
  "dist/guest/worker.py",
  "dist/tools/forkd-runas", // defaultToolsDir: a build step's credentials
  "dist/forkd-launcher", // src/isolation/launcher.ts: the confined QEMU's launcher
  "dist/forkd-netd", // src/net/netd-client.ts: the daemon's network helper
  "dist/forkd-ro-ram.so", // and the library it preloads
  "dist/console/index.html", // src/console/static.ts: the console's page
  "templates/pyagent.toml", // builtinTemplatesDir
  "packaging/forkd.service", // the systemd unit (scripts/build-deb.sh installs it)
];

function fail(message) {
  console.error(`prepack: ${message}`);
  process.exit(1);
}

if (process.env.FORKD_PACK_PREBUILT !== "1") {
  rmSync(at("dist"), { recursive: true, force: true });
  const build = spawnSync("npm", ["run", "build"], { cwd: root, stdio: "inherit" });
  if (build.status !== 0) fail(`npm run build failed (${build.error ?? `exit ${build.status}`})`);
}

const missing = RUNTIME_FILES.filter((rel) => !existsSync(at(rel)));
if (missing.length > 0) fail(`not built: ${missing.join(", ")} (run npm run build)`);

const stale = [];
for (const rel of readdirSync(at("dist/src"), { recursive: true }).map(String)) {
  if (!rel.endsWith(".js")) continue;
  const source = path.join("src", rel.replace(/\.js$/, ".ts"));
  if (!existsSync(at(source))) stale.push(path.join("dist/src", rel));
  else if (statSync(at(source)).mtimeMs > statSync(at(path.join("dist/src", rel))).mtimeMs)
    stale.push(`${path.join("dist/src", rel)} (older than ${source})`);
}
if (stale.length > 0) {
  fail(
    `dist/ is stale, refusing to pack it: ${stale.slice(0, 5).join(", ")}${stale.length > 5 ? ", ..." : ""}`,
  );
}

copyFileSync(at("package-lock.json"), at("npm-shrinkwrap.json"));
