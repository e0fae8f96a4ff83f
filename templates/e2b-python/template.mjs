/**
 * The e2b-python recipe's template, written with E2B's own SDK (`e2b` from npm) exactly as for E2B's cloud: a
 * Python base from a registry, a Debian package (aptInstall), a Python package (pipInstall) from the machine's
 * configured index, the app copied in, a working directory, a user, and a start command with a ready check.
 * build.mjs builds it against whatever E2B_API_URL names (a forkd daemon here).
 */
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template, waitForPort } from "e2b";

const here = path.dirname(fileURLToPath(import.meta.url));

/** The template on `baseImage` (a registry reference of a Debian image with python3 and pip). */
export function e2bPythonTemplate(baseImage) {
  return Template({ fileContextPath: here })
    .fromImage(baseImage)
    .aptInstall(["jq"], { noInstallRecommends: true })
    .pipInstall(["tabulate==0.9.0"])
    .copy("app", "/home/user/app/", { user: "user" })
    .setEnvs({ APP_TITLE: "parts" })
    .setWorkdir("/home/user/app")
    .setUser("user")
    .setStartCmd("python3 server.py 8080", waitForPort(8080));
}
