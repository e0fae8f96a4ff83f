/**
 * The interpreter tests' template (test/e2b/code-interpreter/): a copy of its files with the wheels its pip step installs,
 * downloaded with the machine's own pip configuration (the test venv's pip) for the guest's Python (Debian
 * bookworm's 3.11 on x86-64, binary wheels only). Made once per machine outside the repository, keyed by the
 * template's files, beside the Python venvs; concurrent test processes wait for the one downloading. The image
 * build caches on the wheels' contents, so a rerun rebuilds nothing.
 */
import { createHash } from "node:crypto";
import { copyFile, mkdir, readdir, readFile, rename, rm, stat } from "node:fs/promises";
import path from "node:path";
import { packageRoot } from "../../src/image/package-root.js";
import { e2bPythonVenv, lockedCacheDir, runPython } from "./python-venv.js";

const TEMPLATE_DIR = path.join(packageRoot(), "test", "e2b", "code-interpreter");
const FILES = ["template.toml", "requirements.txt"];
/** The guest's interpreter and platform (template.toml's Debian suite), not the host's. */
const GUEST_WHEEL_TAGS = [
  "--only-binary=:all:",
  "--implementation",
  "cp",
  "--python-version",
  "3.11",
  ...["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any"].flatMap((p) => [
    "--platform",
    p,
  ]),
];

/** The path of the interpreter template's file, its wheels beside it. */
export async function codeInterpreterTemplate(): Promise<string> {
  const texts = await Promise.all(FILES.map((name) => readFile(path.join(TEMPLATE_DIR, name))));
  const hash = createHash("sha256");
  for (const text of texts) hash.update(text);
  hash.update(GUEST_WHEEL_TAGS.join(" "));
  const venv = await e2bPythonVenv();
  return lockedCacheDir(`code-interpreter-${hash.digest("hex").slice(0, 16)}`, async (dir) => {
    const file = path.join(dir, "template.toml");
    if (
      await stat(path.join(dir, "wheels")).then(
        () => true,
        () => false,
      )
    ) {
      return file;
    }
    await rm(dir, { recursive: true, force: true });
    await mkdir(dir, { recursive: true });
    for (const name of FILES) await copyFile(path.join(TEMPLATE_DIR, name), path.join(dir, name));
    const partial = path.join(dir, "wheels.partial");
    await runPython(venv.python, [
      "-m",
      "pip",
      "download",
      "--quiet",
      "--disable-pip-version-check",
      ...GUEST_WHEEL_TAGS,
      "--dest",
      partial,
      "-r",
      path.join(dir, "requirements.txt"),
    ]);
    if ((await readdir(partial)).length === 0) throw new Error(`pip downloaded no wheels into ${partial}`);
    await rename(partial, path.join(dir, "wheels"));
    return file;
  });
}
